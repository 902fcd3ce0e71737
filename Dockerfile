# autotune's controller images (docker-compose.yml builds them; no CI job has built them yet).
#
#   docker build --target sim -t autotune:sim .   # Python + autotune + optuna-dashboard
#   docker build --target gpu -t autotune:gpu .   # vllm/vllm-openai + autotune
#
# The controller launches every trial's `vllm serve` as its own child, so in the gpu image
# autotune runs beside vLLM: autotune lives in its own virtual environment (its dependency
# pins never touch vLLM's), and `vllm` is the image's own executable on PATH.
ARG PYTHON_IMAGE=python:3.11-slim
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

# -- sim: the controller for simulated workers, and optuna-dashboard --------------------
FROM ${PYTHON_IMAGE} AS sim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /opt/autotune/
COPY autotune /opt/autotune/autotune
COPY configs /opt/autotune/configs
COPY docker/controller.sh /usr/local/bin/autotune-controller
RUN pip install /opt/autotune optuna-dashboard \
    && mkdir -p /work /var/lib/autotune/prometheus
WORKDIR /work
ENTRYPOINT ["autotune-controller"]

# -- gpu: the controller on vLLM's own image --------------------------------------------
FROM ${VLLM_IMAGE} AS gpu
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /opt/autotune/
COPY autotune /opt/autotune/autotune
COPY configs /opt/autotune/configs
COPY docker/controller.sh /usr/local/bin/autotune-controller
# `autotune` from its own venv; PATH keeps the image's `vllm` (VIRTUAL_ENV is not set, so
# vLLM's interpreter never sees autotune's packages).
RUN python3 -m venv /opt/autotune-venv \
    && /opt/autotune-venv/bin/pip install /opt/autotune \
    && ln -s /opt/autotune-venv/bin/autotune /usr/local/bin/autotune \
    && mkdir -p /work /var/lib/autotune/prometheus \
    && vllm --version
WORKDIR /work
ENTRYPOINT ["autotune-controller"]
