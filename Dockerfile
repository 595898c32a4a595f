# kvwatch sidecar image.
#   docker build -t REGISTRY/kvwatch:0.1.0 .
#   docker run --rm -p 9747:9747 -e KVWATCH_TARGET_URL=http://HOST:8000/metrics REGISTRY/kvwatch:0.1.0
#   docker build --build-arg KVWATCH_EXTRAS=nvml -t REGISTRY/kvwatch:0.1.0-nvml .   (for config.nvml / --nvml)
# Two stages: the first builds the wheel and a venv (pip, build tools); the second only copies the venv, so
# the final image holds no compiler, no pip cache and no source tree. Both stages use the same pinned base,
# so the venv's interpreter symlink (/usr/local/bin/python3) is valid in the final stage.
# tests/test_dockerfile.py checks these rules; tests/test_wheel_install.py runs the build stage's RUN steps.

FROM python:3.12.12-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-deps --wheel-dir /wheels /src
RUN python -m venv /opt/kvwatch
# Optional extras of pyproject.toml, comma-separated (nvml: read GPU memory through NVML)
ARG KVWATCH_EXTRAS=""
RUN /opt/kvwatch/bin/pip install "$(ls /wheels/*.whl)${KVWATCH_EXTRAS:+[$KVWATCH_EXTRAS]}"

FROM python:3.12.12-slim-bookworm AS runtime
LABEL org.opencontainers.image.title="kvwatch" \
      org.opencontainers.image.description="KV-cache watchdog sidecar for vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/kvwatch /opt/kvwatch
# Read-only root filesystem friendly: no .pyc written at run time (pip compiled them at build time),
# unbuffered logs, and listen on all interfaces inside the container (kvwatch's own default is 127.0.0.1).
ENV PATH=/opt/kvwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KVWATCH_LISTEN_ADDRESS=0.0.0.0
# 65532 is the conventional "nonroot" UID/GID; numeric so Kubernetes runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9747
ENTRYPOINT ["kvwatch"]
CMD ["serve"]
