{{/* Names and labels. */}}
{{- define "spotd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "spotd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "spotd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spotd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "spotd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "spotd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "spotd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spotd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the database URL, and its key. */}}
{{- define "spotd.databaseSecret" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else if .Values.database.url }}
{{- printf "%s-database" (include "spotd.fullname" .) }}
{{- else }}
{{- fail "spotd needs a PostgreSQL database: set database.existingSecret (and database.key) or database.url" }}
{{- end }}
{{- end }}

{{/* The Secret holding the API token. */}}
{{- define "spotd.tokenSecret" -}}
{{- default (printf "%s-api-token" (include "spotd.fullname" .)) .Values.apiToken.existingSecret }}
{{- end }}
