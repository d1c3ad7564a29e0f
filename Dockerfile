# kubeport's image for deploy/daemonset.yaml: docker build -t <registry>/kubeport:0.1.0 .
FROM python:3.11-slim-bookworm

# nft: DROP rules, source ranges and externalIP ports; ip: their policy-routing rule.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables iproute2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# What `pip install .` needs (pyproject maps endpoints/, proxy/, dns/ into the kubeport package);
# not the whole context, which may hold a .venv and .git.
COPY pyproject.toml README.md ./
COPY kubeport kubeport
COPY endpoints endpoints
COPY proxy proxy
COPY dns dns
# kube-proxy's name too: kubeadm's kube-proxy DaemonSet runs `/usr/local/bin/kube-proxy
# --config=... --hostname-override=...`, which this image serves with its image swapped alone.
RUN pip install --no-cache-dir . \
    && rm -rf /src \
    && ln -s "$(command -v kubeport)" /usr/local/bin/kube-proxy

WORKDIR /
# Root: the DaemonSet's NET_ADMIN and NET_BIND_SERVICE take effect only for uid 0.
USER root
ENTRYPOINT ["kubeport"]
