#!/usr/bin/env bash
# Validates Tandem's monitoring: alerts.yaml (rules, conventions, promtool unit tests),
# deploy/k8s/base/prometheusrule.yaml (same groups as alerts.yaml), prometheus.yml / prometheus-local.yml, and
# deploy/grafana/tandem.json (JSON, datasources, panel ids, every PromQL expression parses).
#
#   deploy/prometheus/check.sh           check everything; non-zero exit on the first failure
#   deploy/prometheus/check.sh --write   regenerate prometheusrule.yaml from alerts.yaml, then check
#
# Needs promtool (Debian: apt install prometheus) and python3 with PyYAML (python3-yaml).
# PROMTOOL and PYTHON override the binaries. Works from any directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dashboard="$here/../grafana/tandem.json"
PROMTOOL="${PROMTOOL:-promtool}"
PYTHON="${PYTHON:-python3}"

fail() {
  echo "check.sh: FAILED: $*" >&2
  exit 1
}
step() { echo "== $*"; }

command -v "$PROMTOOL" >/dev/null || fail "promtool not found (apt install prometheus, or set PROMTOOL)"
"$PYTHON" -c 'import yaml' 2>/dev/null || fail "$PYTHON cannot import yaml (apt install python3-yaml)"
[[ -f "$dashboard" ]] || fail "missing $dashboard"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ "${1:-}" == "--write" ]]; then
  step "writing prometheusrule.yaml from alerts.yaml"
  {
    cat <<'HEADER'
# GENERATED from deploy/prometheus/alerts.yaml by `deploy/prometheus/check.sh --write`; edit
# alerts.yaml instead. The same rule groups as a Prometheus Operator PrometheusRule, part of the
# kustomize base (scraping: podmonitor.yaml). Your Prometheus resource's ruleSelector must
# match these labels.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tandem
  labels:
    app.kubernetes.io/part-of: tandem
spec:
HEADER
    sed -n '/^groups:/,$p' "$here/alerts.yaml" | sed 's/^\(.\)/  \1/'
  } >"$here/../k8s/base/prometheusrule.yaml"
elif [[ $# -gt 0 ]]; then
  fail "unknown argument '$1' (usage: check.sh [--write])"
fi

step "promtool check rules alerts.yaml"
"$PROMTOOL" check rules "$here/alerts.yaml" || fail "alerts.yaml does not pass promtool check rules"

step "alert conventions (severity, for, annotations, runbook_url, tandem_query)"
"$PYTHON" - "$here/alerts.yaml" "$tmp/alert_queries.yaml" <<'PY' || fail "alerts.yaml breaks the conventions above"
import re, sys, yaml

src, out = sys.argv[1], sys.argv[2]
doc = yaml.safe_load(open(src))
errors, queries, names = [], [], set()
cmp_re = re.compile(r"^(.*\S)\s*(==|!=|>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)$", re.S)
norm = lambda s: " ".join(s.split())
for group in doc["groups"]:
    for rule in group["rules"]:
        if "record" in rule:
            if not re.fullmatch(r"tandem:[a-z0-9_]+:[a-z0-9_]+", rule["record"]):
                errors.append(f"recording rule {rule['record']}: name is not tandem:<metric>:<operation>")
            continue
        name = rule["alert"]
        where = f"alert {name}"
        if name in names:
            errors.append(f"{where}: duplicate alert name")
        names.add(name)
        if "for" not in rule:
            errors.append(f"{where}: no `for:`")
        if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            errors.append(f"{where}: labels.severity must be critical, warning or info")
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url", "tandem_query"):
            if not str(ann.get(key, "")).strip():
                errors.append(f"{where}: annotation {key} missing or empty")
        want = f"docs/operations.md#alert-{name.lower()}"
        if ann.get("runbook_url") != want:
            errors.append(f"{where}: runbook_url {ann.get('runbook_url')!r}, want {want!r}")
        m = cmp_re.match(norm(rule["expr"]))
        if not m:
            errors.append(f"{where}: expr does not end in `<op> <number>`")
        elif norm(m.group(1)) != norm(ann.get("tandem_query", "")):
            errors.append(f"{where}: tandem_query is not the expr without its final "
                          f"`{m.group(2)} {m.group(3)}`:\n  expr:         {norm(m.group(1))}\n"
                          f"  tandem_query: {norm(ann.get('tandem_query', ''))}")
        # Both halves must parse alone, which a comparison nested in parentheses would not.
        rec = re.sub(r"[^a-z0-9_]", "_", name.lower())
        queries.append({"record": f"check:{rec}:tandem_query", "expr": ann.get("tandem_query", "")})
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
yaml.safe_dump({"groups": [{"name": "alert_queries", "rules": queries}]}, open(out, "w"))
print(f"  {len(names)} alerts follow the conventions")
PY
"$PROMTOOL" check rules "$tmp/alert_queries.yaml" >/dev/null ||
  fail "an alert's tandem_query annotation is not valid PromQL (promtool output above)"

step "every runbook_url names an anchor of docs/operations.md"
"$PYTHON" - "$here/alerts.yaml" "$here/../../docs/operations.md" <<'PY' || fail "a runbook_url has no anchor in docs/operations.md (add <a id=\"alert-...\"></a> there)"
import re, sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "alert" in r]
doc = open(sys.argv[2]).read()
missing = []
for r in rules:
    anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
    if f'id="{anchor}"' not in doc:
        missing.append(f"{r['alert']}: #{anchor}")
for m in missing:
    print("  missing anchor:", m)
print(f"  {len(rules) - len(missing)} of {len(rules)} runbooks documented")
sys.exit(1 if missing else 0)
PY

step "prometheusrule.yaml carries the groups of alerts.yaml"
[[ -f "$here/../k8s/base/prometheusrule.yaml" ]] || fail "missing prometheusrule.yaml (run check.sh --write)"
"$PYTHON" - "$here/alerts.yaml" "$here/../k8s/base/prometheusrule.yaml" <<'PY' || fail "prometheusrule.yaml differs from alerts.yaml: run deploy/prometheus/check.sh --write"
import sys, yaml
rules, wrapped = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
ok = (wrapped.get("apiVersion") == "monitoring.coreos.com/v1" and wrapped.get("kind") == "PrometheusRule"
      and wrapped.get("spec") == rules)
sys.exit(0 if ok else 1)
PY

for config in prometheus.yml prometheus-local.yml; do
  step "promtool check config $config"
  if ! "$PROMTOOL" check config "$here/$config" >"$tmp/config.log" 2>&1; then
    if ! grep -q 'field kubernetes_sd_configs not found' "$tmp/config.log"; then
      cat "$tmp/config.log" >&2
      fail "$config does not pass promtool check config"
    fi
    # Debian's promtool is built without Kubernetes service discovery: check a copy whose
    # kubernetes_sd_configs are replaced by a static target (everything else, relabelling
    # included, is checked as written) and check the Kubernetes SD blocks' shape here.
    echo "  (this promtool lacks kubernetes_sd_configs; checking a copy with static targets)"
    cp "$here/alerts.yaml" "$tmp/alerts.yaml"
    "$PYTHON" - "$here/$config" "$tmp/$config" <<'PY' || fail "$config: kubernetes_sd_configs"
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
for job in cfg.get("scrape_configs", []):
    sds = job.pop("kubernetes_sd_configs", None)
    if sds is None:
        continue
    for sd in sds:
        extra = set(sd) - {"role", "namespaces", "selectors", "api_server", "kubeconfig_file",
                           "attach_metadata", "tls_config", "authorization", "bearer_token_file"}
        if sd.get("role") not in ("pod", "service", "endpoints", "endpointslice", "node", "ingress") or extra:
            sys.exit(f"job {job['job_name']}: bad kubernetes_sd_configs entry {sd}")
    job["static_configs"] = [{"targets": ["placeholder.invalid:9090"]}]
yaml.safe_dump(cfg, open(sys.argv[2], "w"))
PY
    "$PROMTOOL" check config "$tmp/$config" || fail "$config does not pass promtool check config"
  else
    cat "$tmp/config.log"
  fi
done

step "promtool test rules alerts_test.yaml"
(cd "$here" && "$PROMTOOL" test rules alerts_test.yaml) || fail "alerts_test.yaml: promtool unit tests failed"

step "dashboard grafana/tandem.json"
"$PYTHON" - "$dashboard" "$tmp/dashboard_queries.yaml" <<'PY' || fail "grafana/tandem.json is not a valid Tandem dashboard"
import json, re, sys, yaml

path, out = sys.argv[1], sys.argv[2]
try:
    dash = json.load(open(path))
except ValueError as e:
    sys.exit(f"invalid JSON: {e}")
DS = {"type": "prometheus", "uid": "${datasource}"}
# Variables an expr may use, and what stands in for each when checking (and when a test runs the
# queries against Prometheus directly): ".*" matches every namespace, and no namespace at all.
SUBST = {"namespace": ".*"}
errors, queries, ids = [], [], set()
variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
ds_var = variables.get("datasource")
if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
    errors.append("templating needs a `datasource` variable of type datasource, query prometheus")
for name in SUBST:
    if name not in variables:
        errors.append(f"templating has no `{name}` variable")
if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
    errors.append("schemaVersion missing or older than 36")

def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))

for p in walk(dash.get("panels", [])):
    pid, title = p.get("id"), p.get("title", "?")
    where = f"panel {pid} {title!r}"
    if not isinstance(pid, int) or pid in ids:
        errors.append(f"{where}: id missing, not an integer, or not unique")
    ids.add(pid)
    if p.get("type") == "row":
        if p.get("targets"):
            errors.append(f"{where}: a row has targets")
        continue
    if p.get("datasource") != DS:
        errors.append(f"{where}: datasource must be {DS}, is {p.get('datasource')}")
    targets = p.get("targets") or []
    if not targets:
        errors.append(f"{where}: no targets")
    refs = set()
    for t in targets:
        ref = t.get("refId")
        if not ref or ref in refs:
            errors.append(f"{where}: target refId missing or repeated")
        refs.add(ref)
        if t.get("datasource", DS) != DS:
            errors.append(f"{where} target {ref}: datasource must be {DS}")
        expr = t.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            errors.append(f"{where} target {ref}: empty expr")
            continue
        used = set(re.findall(r"\$\{?(\w+)", expr))
        if used - set(SUBST):
            errors.append(f"{where} target {ref}: uses variables {sorted(used - set(SUBST))}; "
                          f"only {sorted(SUBST)} are substituted by tests")
        for name, value in SUBST.items():
            expr = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", value, expr)
        queries.append({"record": f"dashboard:panel_{pid}:{ref}", "expr": expr})
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}, open(out, "w"))
print(f"  {len(ids)} panels, {len(queries)} queries")
PY
"$PROMTOOL" check rules --lint=none "$tmp/dashboard_queries.yaml" >/dev/null ||
  fail "a dashboard query is not valid PromQL (the rule name above is dashboard:panel_<id>:<refId>)"

echo "check.sh: all checks passed"
