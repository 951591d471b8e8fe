"""Other ways to run the deployment a `Plan` describes: each backend turns the same plan
(already judged by the rules) into what its platform runs (k8s: Kubernetes manifests)."""
