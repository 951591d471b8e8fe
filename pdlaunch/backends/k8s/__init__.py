"""The Kubernetes backend: the deployment as manifests (``render --backend k8s``).
:mod:`.manifests` builds them from the plan (engines in :mod:`.pods`, the router in
:mod:`.router`, names and kinds in :mod:`.model`); :mod:`.files` writes and checks them."""

from pdlaunch.moved import forward

# What `pdlaunch.backends.k8s` had before it became this package (its manifests).
__getattr__ = forward("pdlaunch.backends.k8s", "pdlaunch.backends.k8s.manifests")
