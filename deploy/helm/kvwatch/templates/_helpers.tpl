{{/*
Names and labels, after the prometheus-community charts' conventions.
*/}}
{{- define "kvwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvwatch.fullname" -}}
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

{{- define "kvwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The pod template's labels: no chart or app version, so a chart bump that changes nothing in the pod does not
roll every vLLM pod (each restart reloads a model); an image change rolls them anyway.
*/}}
{{- define "kvwatch.podLabels" -}}
{{- /* (app.kubernetes.io/part-of is the chart's default only: nothing selects on it, so a platform's own value wins) */ -}}
{{- range $key := list "app.kubernetes.io/name" "app.kubernetes.io/instance" }}
{{- if or (hasKey ($.Values.commonLabels | default dict) $key) (hasKey ($.Values.podLabels | default dict) $key) }}
{{- fail (printf "commonLabels and podLabels may not set %s: the chart's selectors use it (the Service and monitors would stop matching the pods)" $key) }}
{{- end }}
{{- end }}
{{- $labels := mergeOverwrite (dict "app.kubernetes.io/part-of" "kvwatch") (deepCopy (.Values.commonLabels | default dict)) (deepCopy (.Values.podLabels | default dict)) }}
{{- $_ := set $labels "app.kubernetes.io/name" (include "kvwatch.name" .) }}
{{- $_ := set $labels "app.kubernetes.io/instance" .Release.Name }}
{{- toYaml $labels }}
{{- end }}

{{- define "kvwatch.labels" -}}
{{- include "kvwatch.labelsWith" (dict "root" . "extra" dict) }}
{{- end }}

{{/*
An object's labels: the chart's, commonLabels and ``extra`` (a monitor's additionalLabels) merged as one map, the
later winning, so that no key is written twice (Helm keeps the last, but Flux, kustomize and Argo CD refuse the
duplicate); the selector labels are always the chart's.
*/}}
{{- define "kvwatch.labelsWith" -}}
{{- $root := .root }}
{{- $labels := dict "helm.sh/chart" (include "kvwatch.chart" $root) "app.kubernetes.io/version" (toString $root.Chart.AppVersion) "app.kubernetes.io/managed-by" $root.Release.Service "app.kubernetes.io/part-of" "kvwatch" }}
{{- $labels = mergeOverwrite $labels (deepCopy ($root.Values.commonLabels | default dict)) (deepCopy (.extra | default dict)) }}
{{- $_ := set $labels "app.kubernetes.io/name" (include "kvwatch.name" $root) }}
{{- $_ := set $labels "app.kubernetes.io/instance" $root.Release.Name }}
{{- toYaml $labels }}
{{- end }}

{{/*
A values scalar as text. Helm reads YAML numbers as float64, so 16777216 would print as 1.6777216e+07,
which kvwatch's settings (and vLLM's argparse) reject: whole numbers print as integers.
*/}}
{{- /* An image reference: repository@digest when a digest is given (the tag is then left out: the digest names
the image), else repository:tag. (list repository tag digest) */}}
{{- define "kvwatch.imageRef" -}}
{{- $repository := index . 0 }}{{ $tag := index . 1 }}{{ $digest := index . 2 }}{{ $key := index . 3 -}}
{{- /* The name part of an image reference (the distribution reference grammar): a repository with a tag in it
rendered "r/kvwatch:0.1.0:0.1.0", which the API server takes and the kubelet refuses (InvalidImageName). */ -}}
{{- if not (regexMatch `^(([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(:[0-9]+)?/)?[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$` (toString $repository)) -}}
{{- fail (printf "%s.repository %q is no image name: lower-case path components, a registry host[:port]/ first if any, and no :tag or @digest (put those in %s.tag or %s.digest)" $key (toString $repository) $key $key) -}}
{{- end -}}
{{- if and (eq $key "vllm.image") (not $digest) (eq (toString $tag) "latest") -}}
{{- fail "vllm.image.tag latest is refused: pin a vLLM version (kvwatch reads each version's metric names, and latest changes them under a running release)" -}}
{{- end -}}
{{- if $digest -}}
{{- printf "%s@%s" $repository $digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (include "kvwatch.scalar" $tag) -}}
{{- end -}}
{{- end }}

{{- define "kvwatch.scalar" -}}
{{- /* (within 2^53: past it a float64 holds no exact integer, and int64 wraps past 2^63) */ -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) (lt . 9007199254740992.0) (gt . -9007199254740992.0) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end }}

{{/* Port kvwatch serves /metrics and /healthz on: config.port, else kvwatch's default 9747. */}}
{{- define "kvwatch.metricsPort" -}}
{{- include "kvwatch.scalar" (.Values.config.port | default 9747) -}}
{{- end }}

{{/*
Milliseconds in a Prometheus duration ("15s", "1m30s", "500ms"; the schema checks the syntax). `ms` is tried
before `m` and `s` (RE2 alternation is leftmost-first).
*/}}
{{- define "kvwatch.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|[smhdwy])" (toString .) -1 }}
{{- $total = add $total (mul (atoi (regexReplaceAll "[a-z]+$" . "")) (index $units (regexReplaceAll "^[0-9]+" . ""))) }}
{{- end }}
{{- $total -}}
{{- end }}

{{/* GPUs per pod: one per tensor-parallel rank and pipeline stage. */}}
{{- define "kvwatch.gpuCount" -}}
{{- $vllm := .Values.vllm | default dict }}
{{- mul (int (.Values.config.tensorParallelSize | default 1)) (int (.Values.config.pipelineParallelSize | default 1)) (int ($vllm.dataParallelSize | default 1)) -}}
{{- end }}

{{/*
The kvwatch settings as KVWATCH_* variables: every non-null `config:` key, camelCase -> KVWATCH_SNAKE_CASE.
Defaults the chart decides: listen on all interfaces (probes and Prometheus use the pod IP) and, when vLLM
runs in the same pod, poll it on localhost.
*/}}
{{/*
config.targetUrl as shown outside the pod (the vllm_target label every series and alert text carries, the install
notes): without a user:password in it, which kvwatch itself never shows (docs/reliability.md).
*/}}
{{- define "kvwatch.shownTargetUrl" -}}
{{- /* up to the authority's last "@", as kvwatch reads it (a password may hold an "@"), and the query's values (a
proxy's ?token=), as kvwatch.settings.redact_url shows a URL */ -}}
{{- $url := regexReplaceAll "://[^/]*@" (toString .Values.config.targetUrl) "://" -}}
{{- $query := regexFind "\\?[^#]*" $url -}}
{{- if $query -}}
{{- $url = replace $query (regexReplaceAll "=[^&;]*" $query "=***") $url -}}
{{- end -}}
{{- $url -}}
{{- end }}

{{- define "kvwatch.env" -}}
{{- /* An empty string is unset, as everywhere else in the chart (`--set config.caFile=` gives ""): kvwatch
refuses an empty variable of a setting with a default (KVWATCH_LISTEN_ADDRESS="") and, a container of vLLM's pod,
would take vLLM out of its Service. */}}
{{- $config := dict }}
{{- range $key, $value := (.Values.config | default dict) }}
{{- if not (eq (toString $value) "") }}
{{- $_ := set $config $key $value }}
{{- end }}
{{- end }}
{{- if kindIs "invalid" $config.listenAddress }}
{{- $_ := set $config "listenAddress" "0.0.0.0" }}
{{- end }}
{{- $vllm := .Values.vllm | default dict }}
{{- if and $vllm.enabled (kindIs "invalid" $config.targetUrl) }}
{{- $_ := set $config "targetUrl" (printf "http://127.0.0.1:%s/metrics" (include "kvwatch.scalar" $vllm.port)) }}
{{- end }}
{{- range $key, $value := $config }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "KVWATCH_%s" ($key | snakecase | upper) }}
  value: {{ include "kvwatch.scalar" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The kvwatch container. Uses only .Values (config, kvwatch, vllm.enabled/port), so another chart can embed it:
  containers:
    {{- include "kvwatch.sidecarContainer" (dict "Values" .Values.kvwatchSidecar) | nindent 4 }}
with .Values.kvwatchSidecar holding `config:` and `kvwatch:` shaped like this chart's values (docs/deploy.md).
*/}}
{{- define "kvwatch.sidecarContainer" -}}
{{- $kvwatch := .Values.kvwatch | default dict }}
{{- $image := $kvwatch.image | default dict }}
{{- $deployment := .Values.deployment | default dict }}
{{- $vllm := .Values.vllm | default dict }}
{{- $web := .Values.webConfig | default dict }}
{{- if and $web.tls (not $web.secretName) }}
{{- fail "webConfig.tls needs webConfig.secretName: kvwatch serves TLS only from the web config mounted from that Secret, and HTTPS probes against plain HTTP would restart it forever" }}
{{- end }}
{{- $tls := and $web.secretName $web.tls }}
{{- /* Readiness only when kvwatch is the pod's only container: in a vLLM pod, a not-ready sidecar would take
vLLM out of its Service, and a watchdog must never stop the serving. */}}
{{- $standalone := and (ne (toString $deployment.enabled) "false") (eq (toString $vllm.enabled) "false") }}
{{- $appVersion := "" }}
{{- with .Chart }}{{ $appVersion = .AppVersion }}{{ end }}
{{- if and (ne (toString $vllm.enabled) "false") (eq (include "kvwatch.metricsPort" .) (include "kvwatch.scalar" ($vllm.port | default 8000))) }}
{{- fail (printf "kvwatch's port (config.port, default 9747) and vllm.port are both %s: the containers share the pod's network, so one of them could not listen; change one" (include "kvwatch.metricsPort" .)) }}
{{- end }}
{{- $tag := $image.tag | default $appVersion }}
{{- if and (not $tag) (not $image.digest) }}{{ fail "kvwatch.image.tag (or kvwatch.image.digest) is required when the chart's appVersion is not available" }}{{ end }}
{{- /* No default: no registry publishes a kvwatch image, and an image that cannot be pulled keeps the pod, vLLM's
too, out of its Service. */}}
{{- $repository := required "kvwatch.image.repository is required: the registry path of the image built from the repository's Dockerfile (docs/deploy.md)" $image.repository }}
- name: kvwatch
  image: {{ include "kvwatch.imageRef" (list $repository $tag $image.digest "kvwatch.image") | quote }}
  imagePullPolicy: {{ $image.pullPolicy | default "IfNotPresent" }}
  args:
    - serve
  env:
    {{- $config := .Values.config | default dict }}
    {{- /* What kvwatch refuses at startup, refused here: a sidecar that exits never gets Ready, and its pod (vLLM's)
    leaves the Service with it. */}}
    {{- if and $config.nvml $config.dcgmUrl }}
    {{- fail "set config.nvml or config.dcgmUrl, not both: kvwatch reads GPU memory from one source" }}
    {{- end }}
    {{- /* (a decimal given with --set is a string, whose bounds the schema does not check) */}}
    {{- range $key, $bounds := include "kvwatch.numberBounds" . | fromJson }}
    {{- $value := index $config $key }}
    {{- if kindIs "string" $value }}
    {{- $number := float64 $value }}
    {{- if or (and (hasKey $bounds "minimum") (lt $number $bounds.minimum)) (and (hasKey $bounds "exclusiveMinimum") (le $number $bounds.exclusiveMinimum)) (and (hasKey $bounds "maximum") (gt $number $bounds.maximum)) (and (hasKey $bounds "exclusiveMaximum") (ge $number $bounds.exclusiveMaximum)) }}
    {{- fail (printf "config.%s (%s) must be %s: kvwatch refuses to start otherwise" $key $value $bounds.says) }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- $interval := float64 (toString (default 5 $config.pollIntervalSeconds)) }}
    {{- if and (not (kindIs "invalid" $config.pollTimeoutSeconds)) (ge (float64 (toString $config.pollTimeoutSeconds)) $interval) }}
    {{- fail (printf "config.pollTimeoutSeconds (%v) must be below config.pollIntervalSeconds (%v): kvwatch refuses to start otherwise" $config.pollTimeoutSeconds $interval) }}
    {{- end }}
    {{- if and (not (kindIs "invalid" $config.staleAfterSeconds)) (lt (float64 (toString $config.staleAfterSeconds)) $interval) }}
    {{- fail (printf "config.staleAfterSeconds (%v) must be at least config.pollIntervalSeconds (%v): kvwatch refuses to start otherwise" $config.staleAfterSeconds $interval) }}
    {{- end }}
    {{- if and (not (kindIs "invalid" $config.clockSpeed)) (ne (toString $config.clockSpeed) "") }}
    {{- if gt (mulf $interval (float64 (toString $config.clockSpeed))) 120.0 }}
    {{- fail (printf "config.pollIntervalSeconds (%v) times config.clockSpeed (%v) is more than 120 s of the poll clock: kvwatch refuses to start otherwise" $interval $config.clockSpeed) }}
    {{- end }}
    {{- end }}
    {{- $limit := include "kvwatch.bytes" ((($kvwatch.resources | default dict).limits | default dict).memory) }}
    {{- if $limit }}
    {{- /* A body at the cap peaks at up to 5x it plus the ~36 MB kvwatch idles at (`kvwatch serve --help`), and each
    series kept ~0.9 MB once warm (docs/performance.md, "Memory per series": 900 KiB) */}}
    {{- $body := float64 (toString (default 16777216 $config.maxBodyBytes)) }}
    {{- $series := float64 (toString (default 64 $config.maxSeries)) }}
    {{- if gt (addf (mulf 5 $body) (mulf 921600 $series) 37748736.0) (float64 $limit) }}
    {{- fail (printf "config.maxBodyBytes (%v) and config.maxSeries (%v) can take up to 5x the body plus ~0.9 MB a series plus ~36 MB of memory, more than kvwatch.resources.limits.memory (%v): the sidecar would be OOM-killed; raise the limit or lower the caps" (default 16777216 $config.maxBodyBytes) (default 64 $config.maxSeries) (include "kvwatch.scalar" $kvwatch.resources.limits.memory)) }}
    {{- end }}
    {{- end }}
    {{- if has (toString $config.listenAddress) (list "127.0.0.1" "::1" "localhost") }}
    {{- fail "config.listenAddress must not be a loopback address: the kubelet's probes and Prometheus reach kvwatch on the pod IP" }}
    {{- end }}
    {{- $caFile := and (not (kindIs "invalid" $config.caFile)) (ne (toString $config.caFile) "") }}
    {{- $noVerify := eq (toString $config.tlsVerify) "false" }}
    {{- if and $caFile $noVerify }}
    {{- fail "config.caFile cannot be used with config.tlsVerify false: kvwatch refuses to start otherwise" }}
    {{- end }}
    {{- if and (or $caFile $noVerify) (not (hasPrefix "https:" (lower (toString ($config.targetUrl | default ""))))) }}
    {{- fail (printf "config.%s applies to an https:// config.targetUrl only (beside vLLM, kvwatch polls it over plain http): kvwatch refuses to start otherwise" (ternary "caFile" "tlsVerify" $caFile)) }}
    {{- end }}
    {{- if not (kindIs "invalid" $config.gpu) }}
    {{- /* Normalized as kvwatch.capacity.presets._gpu_key does; _gpus.tpl is written by scripts/sync_chart_files.py. */}}
    {{- $gpuKey := regexReplaceAll "[^a-z0-9]" (lower (toString $config.gpu)) "" | replace "nvidia" "" | replace "geforce" "" }}
    {{- if not (has $gpuKey (include "kvwatch.gpuKeys" . | fromJsonArray)) }}
    {{- fail (printf "config.gpu %q is no GPU kvwatch knows, and it refuses to start on it: set config.gpuMemoryGib instead, or one of: %s" (toString $config.gpu) (include "kvwatch.gpuNames" .)) }}
    {{- end }}
    {{- end }}
    {{- if and (eq (toString $vllm.enabled) "false") (contains "$(NODE_IP)" (toString $config.dcgmUrl)) }}
    {{- fail "config.dcgmUrl with $(NODE_IP) in mode 2 is kvwatch's own node, not necessarily the vLLM pod's: give the dcgm-exporter URL of the node the watched pod runs on" }}
    {{- end }}
    {{- if $config.dcgmUrl }}
    {{- /* First: $(NODE_IP) in config.dcgmUrl expands only to variables defined earlier in the list. */}}
    - name: NODE_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    {{- end }}
    {{- with $config.renameMetrics }}
    {{- /* kvwatch's own refusals (kvwatch.engines.parse_renames, refused_rename), at render: it would exit 2 at every start. */}}
    {{- $targets := include "kvwatch.renameTargets" $ | fromJsonArray }}
    {{- $suffixes := include "kvwatch.sampleParts" $ | fromJsonArray }}
    {{- range (list $config.usageMetric $config.runningMetric $config.waitingMetric) }}
    {{- if . }}
    {{- /* an override's name is read too, as rename_targets counts it: its samples, and its family */}}
    {{- $name := regexReplaceAll "\\{.*$" (toString .) "" | trim }}
    {{- $targets = append $targets $name }}
    {{- range include "kvwatch.sampleSuffixes" $ | fromJsonArray }}{{- $targets = append $targets (printf "%s%s" $name .) }}{{- end }}
    {{- range $suffixes }}{{- if hasSuffix . $name }}{{- $targets = append $targets (trimSuffix . $name) }}{{- end }}{{- end }}
    {{- end }}
    {{- end }}
    {{- $seen := list }}
    {{- range $pair := splitList "," (toString .) }}
    {{- $names := splitList "=" $pair }}
    {{- $page := first $names | trim }}
    {{- $engine := last $names | trim }}
    {{- $pageSuffix := "" }}
    {{- $engineSuffix := "" }}
    {{- range $suffixes }}
    {{- if and (not $pageSuffix) (hasSuffix . $page) }}{{- $pageSuffix = . }}{{- end }}
    {{- if and (not $engineSuffix) (hasSuffix . $engine) }}{{- $engineSuffix = . }}{{- end }}
    {{- end }}
    {{- if eq $page $engine }}
    {{- fail (printf "config.renameMetrics: %s renames a metric to itself" (trim $pair)) }}
    {{- end }}
    {{- if or (has $page $seen) (has $engine $seen) }}
    {{- fail (printf "config.renameMetrics: %s: %s is named twice" (trim $pair) (ternary $page $engine (has $page $seen))) }}
    {{- end }}
    {{- $seen = append (append $seen $page) $engine }}
    {{- if ne $pageSuffix $engineSuffix }}
    {{- fail (printf "config.renameMetrics: %s: one name ends in a sample's suffix (%s) and the other does not: name both families or both samples (proxy_preemptions_total=vllm:num_preemptions_total)" (trim $pair) (join ", " $suffixes)) }}
    {{- end }}
    {{- if not (has $engine $targets) }}
    {{- fail (printf "config.renameMetrics: %s: kvwatch reads no %s: name one of the engine's metrics it reads (docs/metrics.md)" (trim $pair) $engine) }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- if and $config.bearerTokenFile (regexMatch `^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@` (toString $config.targetUrl)) }}
    {{- fail "config.bearerTokenFile cannot be used with credentials in config.targetUrl (user:password@): kvwatch refuses both at start, pick one" }}
    {{- end }}
    {{- if and $config.gpuUuids (not $config.dcgmUrl) (not $config.nvml) }}
    {{- fail "config.gpuUuids needs a GPU source, config.dcgmUrl or config.nvml: kvwatch refuses to start without one" }}
    {{- end }}
    {{- if and (or $config.gpuPod $config.gpuNamespace) (not $config.dcgmUrl) }}
    {{- fail "config.gpuPod and config.gpuNamespace need config.dcgmUrl: only dcgm-exporter labels GPUs with their pod" }}
    {{- end }}
    {{- if and $config.dcgmUrl (not $config.gpuUuids) }}
    {{- if eq (toString $vllm.enabled) "false" }}
    {{- if not $config.gpuPod }}
    {{- fail "config.dcgmUrl in mode 2 needs config.gpuPod (the watched vLLM pod, with config.gpuNamespace) or config.gpuUuids: kvwatch's own pod has no GPUs" }}
    {{- end }}
    {{- else }}
    {{- /* Sidecar: the engine's GPUs are this pod's, as dcgm-exporter's pod mapping labels them. */}}
    {{- if not $config.gpuPod }}
    - name: KVWATCH_GPU_POD
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- end }}
    {{- if not $config.gpuNamespace }}
    - name: KVWATCH_GPU_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- end }}
    {{- end }}
    {{- end }}
    {{- with $kvwatch.extraEnv }}
    {{- /* A name set twice is refused by server-side apply (Helm 4's default). KVWATCH_* the schema keeps out (they
    are config.*); NODE_IP is the chart's with config.dcgmUrl. Before the KVWATCH_* variables: Kubernetes expands a
    $(VAR) in config.targetUrl only to variables defined earlier in the list. */}}
    {{- range . }}
    {{- if and $config.dcgmUrl (eq (toString .name) "NODE_IP") }}
    {{- fail "kvwatch.extraEnv sets NODE_IP, which the chart sets itself for config.dcgmUrl's $(NODE_IP): leave it out" }}
    {{- end }}
    {{- end }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- include "kvwatch.env" . | trim | nindent 4 }}
    {{- if $web.secretName }}
    {{- if (.Values.config | default dict).webConfigFile }}
    {{- fail "set webConfig.secretName or config.webConfigFile, not both (webConfig mounts the file and sets it)" }}
    {{- end }}
    - name: KVWATCH_WEB_CONFIG_FILE
      value: {{ printf "/etc/kvwatch/web/%s" ($web.key | default "web-config.yml") | quote }}
    {{- end }}
  ports:
    - name: metrics
      containerPort: {{ include "kvwatch.metricsPort" . }}
      protocol: TCP
  {{- if $standalone }}
  {{- with $kvwatch.readinessProbe }}
  readinessProbe:
    {{- include "kvwatch.probe" (dict "probe" . "tls" $tls) | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with $kvwatch.livenessProbe }}
  livenessProbe:
    {{- include "kvwatch.probe" (dict "probe" . "tls" $tls) | nindent 4 }}
  {{- end }}
  {{- with $kvwatch.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $kvwatch.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if or $kvwatch.extraVolumeMounts $web.secretName }}
  volumeMounts:
    {{- if $web.secretName }}
    - name: kvwatch-web-config
      mountPath: /etc/kvwatch/web
      readOnly: true
    {{- end }}
    {{- with $kvwatch.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}

{{/*
The pod volumes kvwatch.sidecarContainer mounts (the web config Secret, with webConfig.secretName): a chart that
embeds the container includes this in its pod's volumes too, or the pod is invalid.
*/}}
{{- define "kvwatch.sidecarVolumes" -}}
{{- with (.Values.webConfig | default dict).secretName }}
- name: kvwatch-web-config
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* A probe as given, on HTTPS when kvwatch serves TLS (webConfig.tls): /healthz needs no credentials. */}}
{{- define "kvwatch.probe" -}}
{{- $probe := include "kvwatch.oneHandler" .probe | fromYaml }}
{{- if and .tls $probe.httpGet }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
A probe with one handler: Helm merges a user's tcpSocket, exec or grpc into the default's httpGet, and Kubernetes
refuses a probe with two ("may not specify more than 1 handler type"), so the user's wins.
*/}}
{{- define "kvwatch.oneHandler" -}}
{{- if or .exec .tcpSocket .grpc -}}
{{- toYaml (omit . "httpGet") -}}
{{- else -}}
{{- toYaml . -}}
{{- end -}}
{{- end }}

{{/* vLLM's command-line arguments, built from the same `config:` keys kvwatch's capacity model reads. */}}
{{- define "kvwatch.vllmArgs" -}}
{{- $c := .Values.config }}
{{- $v := .Values.vllm }}
- {{ required "config.model is required when vllm.enabled is true (the model vLLM serves)" $c.model | quote }}
- "--port"
- {{ include "kvwatch.scalar" $v.port | quote }}
{{- with $v.servedModelName }}
- "--served-model-name"
- {{ . | quote }}
{{- end }}
{{- $flags := dict
      "gpuMemoryUtilization" "--gpu-memory-utilization"
      "tensorParallelSize" "--tensor-parallel-size"
      "pipelineParallelSize" "--pipeline-parallel-size"
      "dtype" "--dtype"
      "kvCacheDtype" "--kv-cache-dtype"
      "blockSize" "--block-size"
      "maxModelLen" "--max-model-len"
      "maxNumBatchedTokens" "--max-num-batched-tokens"
      "maxNumSeqs" "--max-num-seqs" }}
{{- /* kvwatch reads the short dtype spellings too (bf16, fp16, fp32); vLLM's argparse takes only its own */ -}}
{{- $vllmSpelling := dict "bf16" "bfloat16" "fp16" "float16" "fp32" "float32" }}
{{- range $key, $flag := $flags }}
{{- $value := index $c $key }}
{{- if not (kindIs "invalid" $value) }}
{{- if and (kindIs "string" $value) (hasKey $vllmSpelling $value) }}
{{- $value = index $vllmSpelling $value }}
{{- end }}
- {{ $flag | quote }}
- {{ include "kvwatch.scalar" $value | quote }}
{{- end }}
{{- end }}
{{- if eq (toString $v.enableChunkedPrefill) "true" }}
- "--enable-chunked-prefill"
{{- else if eq (toString $v.enableChunkedPrefill) "false" }}
- "--no-enable-chunked-prefill"
{{- end }}
{{- with $v.dataParallelSize }}
- "--data-parallel-size"
- {{ include "kvwatch.scalar" . | quote }}
{{- end }}
{{- if not (kindIs "invalid" $v.shutdownTimeoutSeconds) }}
- "--shutdown-timeout"
- {{ include "kvwatch.scalar" $v.shutdownTimeoutSeconds | quote }}
{{- end }}
{{- /* A flag the chart sets from a value, repeated in extraArgs: vLLM takes the last one, so the engine, the probes
and kvwatch's capacity model would describe different deployments. */ -}}
{{- $managed := dict "--port" "vllm.port" "--served-model-name" "vllm.servedModelName" "--model" "config.model"
      "-tp" "config.tensorParallelSize" "-pp" "config.pipelineParallelSize"
      "--data-parallel-size" "vllm.dataParallelSize" "-dp" "vllm.dataParallelSize"
      "--shutdown-timeout" "vllm.shutdownTimeoutSeconds" }}
{{- if not (kindIs "invalid" $v.enableChunkedPrefill) }}
{{- $_ := set $managed "--enable-chunked-prefill" "vllm.enableChunkedPrefill" }}
{{- $_ := set $managed "--no-enable-chunked-prefill" "vllm.enableChunkedPrefill" }}
{{- end }}
{{- range $key, $flag := $flags }}
{{- $_ := set $managed $flag (printf "config.%s" $key) }}
{{- end }}
{{- range $v.extraArgs }}
{{- /* vLLM's parser reads --max_model_len as --max-model-len */ -}}
{{- $name := regexReplaceAll "=.*$" (toString .) "" | replace "_" "-" }}
{{- if hasKey $managed $name }}
{{- fail (printf "vllm.extraArgs has %s: set %s instead, so that vLLM, its probes and kvwatch's capacity model read the same value" $name (index $managed $name)) }}
{{- end }}
- {{ include "kvwatch.scalar" . | quote }}
{{- end }}
{{- end }}

{{/*
Scrape endpoints shared by the ServiceMonitor and the PodMonitor (the Service and container ports carry the
same names): kvwatch on `metrics`, and in mode 1 optionally vLLM's own /metrics on `http`.
*/}}
{{- define "kvwatch.monitorEndpoints" -}}
{{- $m := .monitor }}
{{- /* The rule pack's keep_firing_for (guard_hold in alerts/config.yaml, 1m) rides out one failed poll only if a
scrape comes at least that often, and KVCacheBottleneck's 2-minute medians need several samples. */ -}}
{{- if and $m.interval (gt (include "kvwatch.durationMs" $m.interval | atoi) 60000) }}
{{- fail (printf "%s.interval (%s) is longer than 1m: kvwatch's alert rules want a good scrape within 2 minutes (their guard) beside a failed one, hold a firing alert for 1 minute (keep_firing_for) and take 2-minute medians, which need a scrape at least every minute" .name $m.interval) }}
{{- end }}
{{- if and $m.interval $m.scrapeTimeout }}
{{- $interval := include "kvwatch.durationMs" $m.interval | atoi }}
{{- $timeout := include "kvwatch.durationMs" $m.scrapeTimeout | atoi }}
{{- if and (gt $interval 0) (gt $timeout $interval) }}
{{- fail (printf "%s.scrapeTimeout (%s) is longer than %s.interval (%s): prometheus-operator rejects such a monitor; lower the timeout or raise the interval" .name $m.scrapeTimeout .name $m.interval) }}
{{- end }}
{{- end }}
- port: metrics
  path: /metrics
  {{- with $m.interval }}
  interval: {{ . | quote }}
  {{- end }}
  {{- with $m.scrapeTimeout }}
  scrapeTimeout: {{ . | quote }}
  {{- end }}
  {{- $web := .root.Values.webConfig | default dict }}
  {{- if and $web.secretName $web.tls }}
  scheme: https
  {{- /* Without one Prometheus checks kvwatch's certificate against the system roots and the pod's IP: the target
  is down for good, and KvwatchAbsent fires. */ -}}
  {{- if not $m.tlsConfig }}
  {{- fail (printf "webConfig.tls is on but %s.tlsConfig is empty: Prometheus would check kvwatch's certificate against the system roots and the pod's IP, and every scrape fail; give the CA and serverName (or insecureSkipVerify: true)" .name) }}
  {{- end }}
  tlsConfig:
    {{- toYaml $m.tlsConfig | nindent 4 }}
  {{- else if $m.tlsConfig }}
  {{- fail (printf "%s.tlsConfig is set but kvwatch serves plain HTTP: set webConfig.secretName and webConfig.tls" .name) }}
  {{- end }}
  {{- with $m.basicAuth }}
  {{- if not $web.secretName }}
  {{- fail (printf "%s.basicAuth is set but kvwatch has no web config: set webConfig.secretName" $.name) }}
  {{- end }}
  basicAuth:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  relabelings:
    # The rule pack finds kvwatch's own scrape by this job (KvwatchAbsent: up{job=~".*kvwatch.*"} == 0),
    # whatever nameOverride or the Service is called. The operator sets job before these run.
    - action: replace
      targetLabel: job
      replacement: kvwatch
    {{- if and (eq (toString .root.Values.vllm.enabled) "false") .root.Values.config.targetUrl }}
    # Mode 2: namespace and pod are kvwatch's own pod; alerts and runbooks name the vLLM it watches by this.
    - action: replace
      targetLabel: vllm_target
      replacement: {{ include "kvwatch.shownTargetUrl" .root | replace "$" "$$" | quote }}
    {{- end }}
    {{- with $m.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $m.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- /* vLLM's own endpoint only in mode 1, where this chart names vLLM's port `http`: an embedded sidecar's pod
names its ports as its own chart does. */ -}}
{{- if and .root.Values.deployment.enabled .root.Values.vllm.enabled $m.scrapeVllm }}
- port: http
  path: /metrics
  {{- with $m.interval }}
  interval: {{ . | quote }}
  {{- end }}
  {{- with $m.scrapeTimeout }}
  scrapeTimeout: {{ . | quote }}
  {{- end }}
  relabelings:
    # vLLM's own endpoint is not kvwatch: vLLM down (or loading) is KvwatchTargetDown's, not KvwatchAbsent's.
    - action: replace
      targetLabel: job
      replacement: vllm
{{- end }}
{{- end }}

{{/*
A vLLM probe whose failureThreshold is raised (never lowered) so that periodSeconds x failureThreshold covers
"seconds": the startup probe gets 600 s for loading plus one max-length prefill, the liveness probe one
max-length prefill (vllm.prefillSecondsEstimate, from `kvwatch plan --json`'s long_context; docs/capacity.md).
*/}}
{{- define "kvwatch.sizedProbe" -}}
{{- $probe := include "kvwatch.oneHandler" .probe | fromYaml -}}
{{- if .sized -}}
{{- $period := $probe.periodSeconds | default 10 | float64 -}}
{{- $need := ceil (divf .seconds $period) | int -}}
{{- if gt $need ($probe.failureThreshold | default 3 | int) -}}
{{- $_ := set $probe "failureThreshold" $need -}}
{{- end -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{/*
<fullname>-<suffix> within 63 characters: cut, the fullname keeps a hash of itself, so that two releases whose names
share their beginning still differ, and two suffixes of one release too. Call with (dict "root" $ "suffix" "...").
*/}}
{{- define "kvwatch.suffixedName" -}}
{{- $full := include "kvwatch.fullname" .root }}
{{- $name := printf "%s-%s" $full .suffix }}
{{- if le (len $name) 63 }}
{{- $name }}
{{- else }}
{{- printf "%s-%s-%s" ($full | trunc (int (sub 53 (len .suffix))) | trimSuffix "-") ($full | sha256sum | trunc 8) .suffix }}
{{- end }}
{{- end }}

{{/*
The name of an object that may sit in another namespace (the monitors', the rule's and the dashboard's `namespace`):
there the release's namespace joins it, or two releases of one name in two namespaces wrote the same object.
A long namespace is cut to 12 characters and 8 of its hash.
*/}}
{{- define "kvwatch.placedName" -}}
{{- $suffix := .suffix | default "" -}}
{{- $ns := .root.Release.Namespace -}}
{{- if and .namespace (ne .namespace $ns) -}}
{{- if gt (len $ns) 20 -}}{{- $ns = printf "%s%s" ($ns | trunc 12) ($ns | sha256sum | trunc 8) -}}{{- end -}}
{{- $suffix = printf "%s-%s" $ns $suffix | trimSuffix "-" -}}
{{- end -}}
{{- if $suffix -}}
{{- include "kvwatch.suffixedName" (dict "root" .root "suffix" $suffix) -}}
{{- else -}}
{{- include "kvwatch.fullname" .root -}}
{{- end -}}
{{- end }}

{{/*
A Kubernetes memory quantity in bytes ("256Mi", "1G", "2e9", ".5Gi", "268435456": Kubernetes' quantity grammar, its
binary, decimal and exponent suffixes), "" when unset; a render failure when set and not a quantity (the memory check
was skipped without a word for "2e9").
*/}}
{{- define "kvwatch.bytes" -}}
{{- /* (through kvwatch.scalar: a plain number in a values file is a float64, whose toString is 5e+07) */ -}}
{{- $text := trimPrefix "+" (include "kvwatch.scalar" (. | default "")) -}}
{{- $units := dict "" 1.0 "n" 1e-9 "u" 1e-6 "m" 1e-3 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if $text -}}
{{- if regexMatch "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)[eE][-+]?[0-9]+$" $text -}}
{{- float64 $text -}}
{{- else if regexMatch "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$" $text -}}
{{- $unit := regexFind "[A-Za-z]+$" $text -}}
{{- mulf (float64 (trimSuffix $unit $text)) (index $units $unit) -}}
{{- else -}}
{{- fail (printf "kvwatch.resources.limits.memory (%s) is not a Kubernetes memory quantity (e.g. 256Mi, 1G, 2e9)" $text) -}}
{{- end -}}
{{- end -}}
{{- end }}
