"""An in-process kube-apiserver for the API-server source's tests and the control-plane
benchmark: the server (server.py, its watches in watch.py, the real output shapes in
shapes.py), objects as a real server serves them (objects.py), certificates and
kubeconfigs (tls.py), and the harness of the source's unit tests (harness.py).

Nothing here but harness.py imports pytest or kubeport: bench/apiserver.py loads the
server without either on hand.
"""
