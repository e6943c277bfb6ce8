"""End-to-end tests against the cluster named by KUBECONFIG."""
