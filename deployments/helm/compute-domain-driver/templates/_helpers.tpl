{{/*
Helpers of the compute-domain-driver chart. Object names are fixed (as in config/), so one
release per cluster: the DeviceClasses are cluster-scoped and the admission policies match the
ServiceAccount usernames system:serviceaccount:<namespace>:compute-domain-*.
*/}}

{{/*
The resource.k8s.io version of the DeviceClasses: resourceApiVersion when set, else the newest of
v1, v1beta2, v1beta1 in .Capabilities.APIVersions (Kubernetes 1.34+, 1.33, 1.32), "" when none
(validation.yaml then fails). The driver's binaries discover the same choice themselves at start.
*/}}
{{- define "cdd.resourceApiVersion" -}}
{{- if .Values.resourceApiVersion -}}
{{- .Values.resourceApiVersion -}}
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1" -}}
resource.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2" -}}
resource.k8s.io/v1beta2
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1" -}}
resource.k8s.io/v1beta1
{{- end -}}
{{- end -}}

{{/* The driver namespace: namespaceOverride, else the release namespace. */}}
{{- define "cdd.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/*
Labels of every top-level object: config/default's part-of label plus Helm's own
(docs/operators.md lists these three as the only Helm-only labels). Pod templates and selectors
carry config/'s labels only, so a switch between the two installs does not replace the pods for
a label.
*/}}
{{- define "cdd.labels" -}}
app.kubernetes.io/part-of: compute-domain-driver
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* <repository>/<name>:<tag>; the argument is (list $ "<name>"). */}}
{{- define "cdd.image" -}}
{{- $ := index . 0 -}}
{{- $tag := default $.Chart.AppVersion $.Values.image.tag -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $.Values.image.repository) (index . 1) $tag -}}
{{- end -}}

{{/* The port of a "[host]:port" endpoint. */}}
{{- define "cdd.port" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}

{{/* "true" when resources.computeDomains.imex.mode is hostManaged, else "". */}}
{{- define "cdd.hostManagedIMEX" -}}
{{- if eq (toString (dig "mode" "" (.Values.resources.computeDomains.imex | default dict))) "hostManaged" -}}
true
{{- end -}}
{{- end -}}

{{/* FEATURE_GATES: "Name=bool,..." (names sorted), "" when featureGates is empty. */}}
{{- define "cdd.featureGates" -}}
{{- $items := list -}}
{{- range $name, $on := .Values.featureGates -}}
{{- $items = append $items (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}

{{/* The data of the driver ConfigMap (the configMapGenerator of config/default). */}}
{{- define "cdd.configData" -}}
FEATURE_GATES: {{ include "cdd.featureGates" . | quote }}
LOG_VERBOSITY: {{ toString .Values.logVerbosity | quote }}
{{- end -}}

{{/*
The driver ConfigMap's name: a suffix from its data, as kustomize's configMapGenerator does (not
the same hash function), so changing logVerbosity or featureGates rolls the pods.
*/}}
{{- define "cdd.configName" -}}
{{- printf "compute-domain-driver-config-%s" (include "cdd.configData" . | sha256sum | trunc 10) -}}
{{- end -}}

{{/*
Fail-fast checks of resources.computeDomains.imex, with upstream's messages (the binaries check
the same at start: IMEX_MODE / IMEX_ISOLATION).
*/}}
{{- define "cdd.validateIMEXConfig" -}}
{{- $imex := .Values.resources.computeDomains.imex | default dict -}}
{{- $mode := toString (dig "mode" "driverManaged" $imex) -}}
{{- $isolation := toString (dig "isolation" "domain" $imex) -}}
{{- $gates := .Values.featureGates | default dict -}}
{{- $gateEnabled := and (hasKey $gates "HostManagedIMEXDaemon") (eq (toString (get $gates "HostManagedIMEXDaemon")) "true") -}}
{{- if eq $mode "hostManaged" -}}
  {{- if not $gateEnabled -}}
    {{- fail "resources.computeDomains.imex.mode=hostManaged requires featureGates.HostManagedIMEXDaemon=true" -}}
  {{- end -}}
{{- else if ne $mode "driverManaged" -}}
  {{- fail (printf "unknown resources.computeDomains.imex.mode %q: must be \"driverManaged\" or \"hostManaged\"" $mode) -}}
{{- end -}}
{{- if and (ne $isolation "") (ne $isolation "domain") -}}
  {{- if eq $isolation "channel" -}}
    {{- fail "resources.computeDomains.imex.isolation=channel is not supported yet: per-workload IMEX channel allocation is not implemented. Use the default, \"domain\"." -}}
  {{- else -}}
    {{- fail (printf "unknown resources.computeDomains.imex.isolation %q: must be \"domain\" or \"channel\"" $isolation) -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/*
Feature-gate dependencies, checked at render time as the binaries check them at start
(pkg/featuregates.py FeatureGates.validate: a gate's value is its explicit one, else AllAlpha or
AllBeta for its stage, else its default), so a refused combination fails `helm template` instead
of crash-looping after install. Unknown names are values.schema.json's. The table holds every
gate's default and stage; test/unit/helm checks it against pkg/featuregates.py.
*/}}
{{- define "cdd.validateFeatureGates" -}}
{{- $set := .Values.featureGates | default dict -}}
{{- $known := dict
  "IMEXDaemonsWithDNSNames" (list true "Beta")
  "ComputeDomainCliques" (list true "Beta")
  "CrashOnNVLinkFabricErrors" (list true "Beta")
  "HostManagedIMEXDaemon" (list false "Alpha")
  "FabricManagerPartitioning" (list false "Alpha")
  "TimeSlicingSettings" (list false "Alpha")
  "MPSSupport" (list false "Alpha")
  "PassthroughSupport" (list false "Alpha")
  "NVMLDeviceHealthCheck" (list false "Alpha")
  "DynamicMIG" (list false "Alpha")
  "DeviceMetadata" (list false "Alpha")
  "DRAListTypeAttributes" (list false "Alpha")
  "ConsumableShares" (list false "Alpha")
  "ContextualLogging" (list true "Beta")
  "LoggingAlphaOptions" (list false "Alpha")
  "LoggingBetaOptions" (list true "Beta")
-}}
{{- $on := dict -}}
{{- range $name, $spec := $known -}}
  {{- $value := index $spec 0 -}}
  {{- $switch := printf "All%s" (index $spec 1) -}}
  {{- if hasKey $set $name -}}
    {{- $value = get $set $name -}}
  {{- else if hasKey $set $switch -}}
    {{- $value = get $set $switch -}}
  {{- end -}}
  {{- $_ := set $on $name (eq (toString $value) "true") -}}
{{- end -}}
{{- range $pair := list (list "ComputeDomainCliques" "IMEXDaemonsWithDNSNames") (list "DeviceMetadata" "PassthroughSupport") -}}
  {{- $gate := index $pair 0 -}}
  {{- $need := index $pair 1 -}}
  {{- if and (get $on $gate) (not (get $on $need)) -}}
    {{- fail (printf "featureGates: %s requires %s to also be enabled (set featureGates.%s=true or featureGates.%s=false)" $gate $need $need $gate) -}}
  {{- end -}}
{{- end -}}
{{- range $pair := list (list "DynamicMIG" "PassthroughSupport") (list "DynamicMIG" "NVMLDeviceHealthCheck") (list "DynamicMIG" "MPSSupport") (list "PassthroughSupport" "NVMLDeviceHealthCheck") -}}
  {{- if and (get $on (index $pair 0)) (get $on (index $pair 1)) -}}
    {{- fail (printf "featureGates: %s is currently mutually exclusive with %s" (index $pair 0) (index $pair 1)) -}}
  {{- end -}}
{{- end -}}
{{- end -}}
