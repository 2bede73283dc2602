{{/* Names and labels. */}}
{{- define "flywheel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flywheel.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flywheel.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "flywheel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flywheel
{{- end -}}

{{- define "flywheel.operatorSelector" -}}
app.kubernetes.io/name: {{ include "flywheel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "flywheel.apiSelector" -}}
app.kubernetes.io/name: {{ include "flywheel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: api
{{- end -}}

{{- define "flywheel.etcdSelector" -}}
app.kubernetes.io/name: {{ include "flywheel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{- define "flywheel.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flywheel.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The REST API's own ServiceAccount (it never shares the operator's). */}}
{{- define "flywheel.apiServiceAccountName" -}}
{{- if .Values.api.serviceAccount.create -}}
{{- default (printf "%s-api" (include "flywheel.fullname" .) | trunc 63 | trimSuffix "-") .Values.api.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.api.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The one namespace the REST API serves (`--namespace`) when rbac.clusterWide is false: api.namespace, else the
operator's only watched namespace. */}}
{{- define "flywheel.apiNamespace" -}}
{{- if .Values.api.namespace -}}
{{- .Values.api.namespace -}}
{{- else -}}
{{- $watched := include "flywheel.watchNamespaces" . | fromJsonArray -}}
{{- if gt (len $watched) 1 -}}
{{- fail "api.enabled: the REST API serves one namespace (or all with rbac.clusterWide=true); set api.namespace to one of operator.watchNamespaces" -}}
{{- end -}}
{{- first $watched -}}
{{- end -}}
{{- end -}}

{{- define "flywheel.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespaces the operator watches when not cluster-wide (default: the release namespace). */}}
{{- define "flywheel.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- toJson .Values.operator.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "flywheel.etcdName" -}}
{{- printf "%s-etcd" (include "flywheel.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* --etcd-endpoints: every member of the chart's etcd by its stable DNS name, else etcd.externalEndpoints. */}}
{{- define "flywheel.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $name := include "flywheel.etcdName" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s-%d.%s.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else if .Values.etcd.externalEndpoints -}}
{{- join "," .Values.etcd.externalEndpoints -}}
{{- else -}}
{{- fail "etcd.enabled is false: set etcd.externalEndpoints (host:port of an etcd v3 cluster)" -}}
{{- end -}}
{{- end -}}

{{/* Restricted-profile security settings shared by every container. */}}
{{- define "flywheel.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}
