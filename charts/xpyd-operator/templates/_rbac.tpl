{{/* The operator's permissions, split by scope. Derived from what operator/xpyd_operator
calls; docs/architecture.md lists why each rule exists. No Secrets; ConfigMaps get only. */}}

{{/* Rules on namespaced resources: a ClusterRole's in cluster mode, a Role's in namespace mode. */}}
{{- define "xpyd.rules.namespaced" -}}
# Its own API: Kopf watches it; the reconciler and the autoscaler read it and server-side-apply status.
- apiGroups: ["xpyd.io"]
  resources: ["disaggregateddeployments"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["xpyd.io"]
  resources: ["disaggregateddeployments/status"]
  verbs: ["patch"]
# The children it owns: listed by label, server-side-applied (create on first apply), deleted when
# no longer wanted; Kopf watches the StatefulSets and Deployments; the autoscaler patches replicas.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.networkPolicy.enabled: one NetworkPolicy per pod role of a deployment.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# NVL72 only: the IMEX channel of a multi-node NVLink domain.
- apiGroups: ["resource.nvidia.com"]
  resources: ["computedomains"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Multi-node replicas: one LeaderWorkerSet group of pods per replica (the operator writes replicas).
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Routers that serve TLS: a PodMonitor each, scraping over HTTPS (when the cluster serves the API).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Read-only: pod readiness and placement for status. Each router's Role grants pods and
# endpointslices reads, and RBAC forbids granting what the granter does not hold.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# The model's config.json a deployment names in spec.model.configMap: get by name, never list or watch.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
# Events on a DisaggregatedDeployment when its conditions change.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/* Read-only rules on cluster-scoped resources. */}}
{{- define "xpyd.rules.cluster" -}}
# GPU topology of the nodes (GPU Feature Discovery labels) for placement and status.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# Whether ComputeDomain's CRD exists, and Kopf's discovery of resources appearing and going.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* Namespace-scoped mode only: NVL72 placement counts the GPUs every pod and every xpyd
StatefulSet holds on each rack, in all namespaces (read-only). Cluster mode has these already. */}}
{{- define "xpyd.rules.clusterWorkloadReads" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch"]
{{- end -}}
