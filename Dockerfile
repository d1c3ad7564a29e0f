# kubeport's image for deploy/daemonset.yaml: docker build -t <registry>/kubeport:0.1.0 .
# Without a registry, on a Debian base made from Debian's packages: deploy/image/build.sh
# (docs/image.md). BASE is any Debian bookworm with python3 (3.11) and its venv module.
ARG BASE=python:3.11-slim-bookworm

# The wheel. deploy/image/build.sh builds it outside and hands it in as the build context
# named "wheel" (--build-context wheel=DIR), which replaces this stage.
FROM ${BASE} AS wheel
WORKDIR /src
# What the wheel is built from (setup.py maps endpoints/, proxy/, dns/ into the kubeport
# package); not the whole context, which may hold a .venv and .git.
COPY pyproject.toml setup.py README.md ./
COPY kubeport kubeport
COPY endpoints endpoints
COPY proxy proxy
COPY dns dns
RUN python3 -m venv /tmp/build \
    && /tmp/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheel .

FROM ${BASE}
# nft: DROP rules, source ranges and externalIP ports; ip: their policy-routing rule. A base
# made by deploy/image/build.sh has them already.
RUN if ! command -v nft >/dev/null || ! command -v ip >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends nftables iproute2 \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# A virtual environment: Debian's python3 refuses installs into the system's site-packages
# (PEP 668, EXTERNALLY-MANAGED), and the same recipe then serves both bases. pip itself
# is removed after the install: nothing is installed at run time. kube-proxy's name too:
# kubeadm's kube-proxy DaemonSet runs `/usr/local/bin/kube-proxy --config=...
# --hostname-override=...`, which this image serves with its image swapped alone.
COPY --from=wheel /wheel/ /tmp/wheel/
RUN python3 -m venv /opt/kubeport \
    && /opt/kubeport/bin/pip install --no-cache-dir /tmp/wheel/*.whl \
    && /opt/kubeport/bin/pip uninstall --yes --quiet pip setuptools \
    && rm -rf /tmp/wheel \
    && ln -s /opt/kubeport/bin/kubeport /usr/local/bin/kubeport \
    && ln -s /opt/kubeport/bin/kubeport /usr/local/bin/kube-proxy

WORKDIR /
# Root: the DaemonSet's NET_ADMIN and NET_BIND_SERVICE take effect only for uid 0.
USER root
ENTRYPOINT ["kubeport"]
