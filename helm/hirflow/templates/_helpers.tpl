{{/* Chart name, truncated to the 63 characters a label value may hold. */}}
{{- define "hirflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "hirflow.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hirflow.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hirflow.labels" -}}
helm.sh/chart: {{ include "hirflow.chart" . }}
{{ include "hirflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hirflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hirflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Worker pods only (the trainer and hook pods share the other selector labels). */}}
{{- define "hirflow.workerSelectorLabels" -}}
{{ include "hirflow.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "hirflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hirflow.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hirflow.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion .Values.image.flavor) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* The claim holding checkpoints; empty when no pod needs one. */}}
{{- define "hirflow.checkpointsClaim" -}}
{{- if .Values.checkpoints.persistence.existingClaim }}
{{- .Values.checkpoints.persistence.existingClaim }}
{{- else if .Values.trainer.enabled }}
{{- printf "%s-checkpoints" (include "hirflow.fullname" .) }}
{{- end }}
{{- end }}

{{/* librdkafka security settings; the SASL credentials arrive as env vars from a Secret. */}}
{{- define "hirflow.kafkaClient" -}}
{{- $client := dict "security.protocol" .Values.kafka.securityProtocol }}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
{{- $_ := set $client "sasl.mechanism" .Values.kafka.sasl.mechanism }}
{{- end }}
{{- if and (hasSuffix "SSL" .Values.kafka.securityProtocol) .Values.kafka.tls.caSecret }}
{{- $_ := set $client "ssl.ca.location" (printf "/etc/hirflow/kafka-ca/%s" .Values.kafka.tls.caKey) }}
{{- end }}
{{- toYaml $client }}
{{- end }}

{{/* config.toml: the user's config keys plus the keys the chart owns. */}}
{{- define "hirflow.configToml" -}}
{{- $managed := dict
      "graph" (dict "path" "/data/state")
      "worker" (dict "web_host" "0.0.0.0" "web_port" (int .Values.workers.port) "count" (int .Values.workers.replicas))
      "kafka" (dict "client" (include "hirflow.kafkaClient" . | fromYaml))
      "train" (dict "out" .Values.checkpoints.mountPath "train_share" .Values.trainer.trainShare
                    "seed" (int .Values.trainer.seed) "announce" true) }}
{{- with .Values.trainer.stepsPerChunk }}
{{- $_ := set $managed.train "steps_per_chunk" (int .) }}
{{- end }}
{{- if .Values.kafka.bootstrap }}
{{- $_ := set $managed.kafka "bootstrap" .Values.kafka.bootstrap }}
{{- end }}
{{- $_ := set $managed "refresh" (dict "checkpoints_root" .Values.checkpoints.mountPath) }}
{{- if .Values.workers.checkpoint }}
{{- $_ := set $managed.refresh "checkpoint" (printf "%s/%s" .Values.checkpoints.mountPath .Values.workers.checkpoint) }}
{{- end }}
{{- toToml (mustMergeOverwrite (deepCopy .Values.config) $managed) }}
{{- end }}

{{/* The query API's bearer token, from a Secret (workers and the helm test pod). */}}
{{- define "hirflow.apiTokenEnv" -}}
{{- with .Values.workers.apiTokenSecret.name }}
- name: HIRFLOW_WORKER__API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.workers.apiTokenSecret.key }}
{{- end }}
{{- end }}

{{/* Environment shared by every hirflow container: config file, Kafka endpoints and credentials. */}}
{{- define "hirflow.env" -}}
- name: HIRFLOW_CONFIG
  value: /etc/hirflow/config.toml
{{- if not .Values.kafka.bootstrap }}
- name: HIRFLOW_KAFKA__BOOTSTRAP
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.bootstrapSecret.name }}
      key: {{ .Values.kafka.bootstrapSecret.key }}
{{- end }}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
- name: HIRFLOW_KAFKA__CLIENT__SASL__USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- end }}

{{/* Volumes every hirflow container mounts: the config and the Kafka CA. */}}
{{- define "hirflow.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "hirflow.fullname" . }}
{{- if and (hasSuffix "SSL" .Values.kafka.securityProtocol) .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret }}
{{- end }}
{{- end }}

{{- define "hirflow.configMounts" -}}
- name: config
  mountPath: /etc/hirflow
  readOnly: true
{{- if and (hasSuffix "SSL" .Values.kafka.securityProtocol) .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/hirflow/kafka-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* GPU requests added to a component's resources when its gpu.enabled is set. */}}
{{- define "hirflow.resources" -}}
{{- $res := deepCopy (.resources | default dict) }}
{{- if .gpu.enabled }}
{{- $limits := get $res "limits" | default dict }}
{{- $_ := set $limits "nvidia.com/gpu" (int .gpu.count) }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/* Fails the render with one message per inconsistent value. */}}
{{- define "hirflow.validateValues" -}}
{{- $errors := list }}
{{- if and (not .Values.kafka.bootstrap) (not .Values.kafka.bootstrapSecret.name) }}
{{- $errors = append $errors "kafka: set kafka.bootstrap or kafka.bootstrapSecret.name (the brokers of the existing Kafka cluster)" }}
{{- end }}
{{- if and (hasPrefix "SASL_" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.existingSecret) }}
{{- $errors = append $errors (printf "kafka: securityProtocol %s needs kafka.sasl.existingSecret (a Secret with the username and password)" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if and .Values.kafka.tls.caSecret (not (hasSuffix "SSL" .Values.kafka.securityProtocol)) }}
{{- $errors = append $errors (printf "kafka: tls.caSecret is set but securityProtocol %s does not use TLS" .Values.kafka.securityProtocol) }}
{{- end }}
{{- $partitions := int (dig "kafka" "partitions" 8 .Values.config) }}
{{- if gt (int .Values.workers.replicas) $partitions }}
{{- $errors = append $errors (printf "workers: replicas (%d) > config.kafka.partitions (%d) leaves workers without partitions" (int .Values.workers.replicas) $partitions) }}
{{- end }}
{{- range $section, $keys := dict "graph" (list "path") "worker" (list "web_host" "web_port" "count" "index" "api_token") "kafka" (list "bootstrap" "client") "train" (list "out" "train_share" "seed" "steps_per_chunk" "announce") "refresh" (list "checkpoints_root") }}
{{- range $keys }}
{{- if hasKey (get $.Values.config $section | default dict) . }}
{{- $errors = append $errors (printf "config.%s.%s is set by the chart; remove it from values" $section .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (or .Values.workers.gpu.enabled (and .Values.trainer.enabled .Values.trainer.gpu.enabled)) (ne .Values.image.flavor "cuda") }}
{{- $errors = append $errors "gpu: workers.gpu or trainer.gpu is enabled but image.flavor is cpu; the CPU image has no CUDA torch (set image.flavor: cuda)" }}
{{- end }}
{{- if and .Values.workers.gpu.enabled (eq (dig "refresh" "device" "auto" .Values.config) "cpu") }}
{{- $errors = append $errors "gpu: workers.gpu is enabled but config.refresh.device is cpu" }}
{{- end }}
{{- if and .Values.workers.checkpoint (not (include "hirflow.checkpointsClaim" .)) }}
{{- $errors = append $errors "workers.checkpoint needs a checkpoint volume: enable the trainer or set checkpoints.persistence.existingClaim" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}
{{- $errors = append $errors "serviceMonitor.enabled needs the Prometheus Operator CRDs (monitoring.coreos.com/v1) in the cluster" }}
{{- end }}
{{- if $errors }}
{{- fail (printf "\n\nVALUES VALIDATION:\n%s" (join "\n" $errors)) }}
{{- end }}
{{- end }}

{{/* Pod-level settings every hirflow pod shares: pull secrets and the security context. */}}
{{- define "hirflow.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
  {{- end }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
