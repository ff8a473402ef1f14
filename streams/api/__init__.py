"""The query API: HTTP endpoints, their framework-free logic, the OpenAPI document."""
