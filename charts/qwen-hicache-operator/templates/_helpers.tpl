{{/* Names: <release>-qwen-hicache-operator unless the release name already contains the chart name. */}}
{{- define "qhc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "qhc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "qhc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "qhc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "qhc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "qhc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: qwen-hicache
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "qhc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "qhc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "qhc.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The operator's API calls, one rule per (group, resources) with exactly the verbs it makes; each reason is
in docs/install.md and tests/rbac/ checks them against the calls recorded from a running operator.
Shared by the ClusterRole (cluster-wide mode) and every Role (namespace-scoped mode).
*/}}
{{- define "qhc.rules" -}}
# The custom resource: Kopf lists and watches it, reads it fresh before each reconcile, and patches
# its own bookkeeping annotations (progress, last-handled spec).
- apiGroups: ["qwenhicache.io"]
  resources: ["qwenhicacheservers"]
  verbs: ["get", "list", "watch", "patch"]
# One merge patch of status per reconcile.
- apiGroups: ["qwenhicache.io"]
  resources: ["qwenhicacheservers/status"]
  verbs: ["patch"]
# The serving pods' StatefulSet: read to compare, server-side apply (a PATCH; when the object does not
# exist yet the API server authorizes it as create too), watched for readiness changes; deleted with
# propagationPolicy Orphan (pods kept) when a disk-tier change needs new volumeClaimTemplates, which a
# StatefulSet cannot change in place.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A multi-node server's LeaderWorkerSet (nodesPerReplica > 1; needs the LWS controller): read to compare,
# server-side apply (create + patch), its partition lowered group by group during a rolling restart; watched
# (managed-by label) so a group's readiness refreshes the owner's status. Without the LWS CRD nothing is called.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The client, headless and router Services: listed by the server's labels to compare (one list for all of
# them), server-side apply (create + patch, as above).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "create", "patch"]
# Events on the resource (condition transitions, Kopf's handler errors).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The serving pods: listed by label for readiness and restart progress, watched for the rollout poll's index. Never created (the StatefulSet
# does that) nor deleted directly: an ordered, cache-aware restart evicts one pod at a time (with a uid
# precondition) through the eviction API, so the server's PodDisruptionBudget applies to it too.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
# One PodDisruptionBudget per server (rollout.maxUnavailable, so a node drain keeps the rollout's promise):
# read to compare, server-side apply (create + patch, as above). Goes with the resource (owner reference).
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
# The per-pod cache volumes: listed by label, annotated with the cache fingerprint and expanded when
# hicache.disk.size grows (merge patches).
# Never deleted: they outlive the resource and the operator.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "patch"]
# The runtime's admin API key Secret: create-only, never read back (no get/list/watch on secrets).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# The router (spec.router, replicas > 1): its Deployment, read to compare and server-side applied (a create
# the first time). Never deleted: a router no longer wanted is scaled to zero; it goes with the resource.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch"]
# The router's worker manifest: read to compare and applied; the rollout rewrites it to drain a pod.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
{{- end -}}

{{/* Namespaces the operator watches: the list, or empty for cluster-wide. */}}
{{- define "qhc.clusterWide" -}}
{{- if not .Values.watch.namespaces -}}true{{- end -}}
{{- end -}}
