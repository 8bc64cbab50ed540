// Offline checks of rendered Tandem manifests (run by validate.sh, which renders the overlays).
// usage: node validate.mjs NODE_MODULES OUT_DIR NAME=RENDERED.yaml ...
//
// 1. Schema: every object against the Kubernetes OpenAPI schema of its kind (kubernetes-models;
//    PodMonitor from @kubernetes-models/prometheus-operator, Issuer and Certificate from
//    @kubernetes-models/cert-manager). Those schemas accept unknown
//    fields, so fields are also checked against the models' type declarations (a misspelt
//    `readinesProbe` is an error, as it is for `kubectl apply` with strict field validation).
//    A kind without a model is an error.
// 2. Policy the schemas do not express (see POLICY below).
// The config of each overlay is written to OUT_DIR/NAME/tandem.yaml for `tandem config`.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, outDir, ...overlayArgs] = process.argv.slice(2);
if (!nodeModules || !outDir || overlayArgs.length === 0) {
  console.error("usage: node validate.mjs NODE_MODULES OUT_DIR NAME=RENDERED.yaml ...");
  process.exit(2);
}
const YAML = await import(pathToFileURL(path.join(nodeModules, "yaml/dist/index.js")).href);

// ---------------------------------------------------------------------------------------------
// Schema models
// ---------------------------------------------------------------------------------------------

// apiVersion "group/version" or "version" (core) -> directory holding Kind.js / Kind.d.ts.
function modelDir(apiVersion) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return path.join(nodeModules, "@kubernetes-models/prometheus-operator", group, version);
  }
  if (group === "cert-manager.io") {
    return path.join(nodeModules, "@kubernetes-models/cert-manager", group, version);
  }
  return path.join(nodeModules, "kubernetes-models", group, version);
}

async function loadModel(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z0-9]+$/.test(kind)) {
    return null;
  }
  const file = path.join(modelDir(apiVersion), `${kind}.js`);
  if (!fs.existsSync(file)) return null;
  const mod = await import(pathToFileURL(file).href);
  const cls = mod[kind];
  if (typeof cls !== "function" || cls.apiVersion !== apiVersion || cls.kind !== kind) return null;
  return { cls, dts: file.replace(/\.js$/, ".d.ts") };
}

// Field names per interface, read from the models' .d.ts files. An interface is
// { fields: Map<name, typeText>, open: bool, file }; open when something could not be resolved
// (then unknown fields are not reported there: no false alarms from the parser's limits).
const interfaceCache = new Map();

function resolveImport(fromFile, spec) {
  const base = spec.startsWith(".") ? path.resolve(path.dirname(fromFile), spec)
                                    : path.join(nodeModules, spec);
  const dts = base.replace(/\.js$/, "") + ".d.ts";
  return fs.existsSync(dts) ? dts : null;
}

function parseDts(file) {
  const text = fs.readFileSync(file, "utf8").replace(/\/\*\*[\s\S]*?\*\//g, "");
  const imports = new Map();
  for (const m of text.matchAll(/import\s*\{\s*([^}]+)\}\s*from\s*"([^"]+)"/g)) {
    for (const name of m[1].split(",").map((s) => s.trim()).filter(Boolean)) {
      imports.set(name, m[2]);
    }
  }
  return { text, imports };
}

// The interface exported from `file` under any alias (`export type { IX as IIoK8s... }`).
function interfaceOf(file) {
  if (interfaceCache.has(file)) return interfaceCache.get(file);
  const result = { fields: new Map(), open: false, file, imports: new Map() };
  interfaceCache.set(file, result);
  const { text, imports } = parseDts(file);
  result.imports = imports;
  const head = text.match(/export interface (\w+)(?:\s+extends\s+([^{]+))?\s*\{/);
  if (!head) {
    result.open = true;  // a type alias (Quantity, IntOrString, ...): a leaf
    result.leaf = true;
    return result;
  }
  // Body: up to the brace that closes the interface.
  let depth = 0, i = head.index + head[0].length - 1, start = i + 1;
  for (; i < text.length; i++) {
    if (text[i] === "{") depth++;
    else if (text[i] === "}" && --depth === 0) break;
  }
  const body = text.slice(start, i);
  // Top-level properties: `"name"?: type;` at depth 0 of the body.
  depth = 0;
  let stmt = "";
  for (const ch of body) {
    if (ch === "{" || ch === "<" || ch === "(" || ch === "[") depth++;
    if (ch === "}" || ch === ">" || ch === ")" || ch === "]") depth--;
    if (ch === ";" && depth === 0) {
      const m = stmt.trim().match(/^"?([^"?:]+)"?\??\s*:\s*([\s\S]+)$/);
      if (m) result.fields.set(m[1], m[2].trim());
      else if (stmt.trim()) result.open = true;  // an index signature or something unexpected
      stmt = "";
    } else {
      stmt += ch;
    }
  }
  for (const parent of (head[2] || "").split(",").map((s) => s.trim()).filter(Boolean)) {
    if (parent === "TypeMeta") {
      result.fields.set("apiVersion", "string");
      result.fields.set("kind", "string");
      continue;
    }
    const spec = imports.get(parent);
    const dts = spec && resolveImport(file, spec);
    if (!dts) { result.open = true; continue; }
    const p = interfaceOf(dts);
    if (p.open) result.open = true;
    // A parent's field types name the parent file's imports: remember where each was declared.
    result.fileOf = result.fileOf || {};
    for (const [k, v] of p.fields) {
      result.fields.set(k, v);
      result.fileOf[k] = (p.fileOf && p.fileOf[k]) || dts;
    }
  }
  return result;
}

// Checks `value` against type text `type` declared in `file`; pushes "path: unknown field" errors.
function checkFields(value, type, file, where, errors) {
  if (value === null || value === undefined) return;
  type = type.trim();
  const arr = type.match(/^Array<([\s\S]+)>$/);
  if (arr) {
    if (Array.isArray(value)) value.forEach((v, i) => checkFields(v, arr[1], file, `${where}[${i}]`, errors));
    return;
  }
  const map = type.match(/^\{\s*\[key: string\]:\s*([\s\S]+?);?\s*\}$/);
  if (map) {
    if (typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) checkFields(v, map[1], file, `${where}.${k}`, errors);
    }
    return;
  }
  if (!/^\w+$/.test(type)) return;  // unions, literals, inline objects: the schema checks those
  const { imports } = interfaceOf(file);
  const spec = imports.get(type);
  if (!spec) return;  // string, number, boolean, ...
  const dts = resolveImport(file, spec);
  if (!dts) return;
  checkObject(value, dts, where, errors);
}

function checkObject(value, dts, where, errors) {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return;
  const iface = interfaceOf(dts);
  if (iface.leaf) return;
  for (const [k, v] of Object.entries(value)) {
    if (!iface.fields.has(k)) {
      if (!iface.open) {
        errors.push(`${where}.${k}: unknown field (known: ${[...iface.fields.keys()].join(", ")})`);
      }
      continue;
    }
    const declaredIn = (iface.fileOf && iface.fileOf[k]) || dts;
    checkFields(v, iface.fields.get(k), declaredIn, `${where}.${k}`, errors);
  }
}

// ---------------------------------------------------------------------------------------------
// POLICY: rules of our own
// ---------------------------------------------------------------------------------------------
const COMPONENTS = {
  router: { service: "tandem.v1.Inference", port: 8000, kind: "Deployment" },
  prefill: { service: "tandem.v1.PrefillWorker", port: 7100, kind: "Deployment" },
  decode: { service: "tandem.v1.DecodeWorker", port: 7200, kind: "Deployment" },
  "cache-store": { service: "tandem.v1.CacheStore", port: 7000, kind: "StatefulSet" },
};
const GPU_COMPONENTS = new Set(["prefill", "decode"]);
const GPU = "nvidia.com/gpu";
// The pods that move KV blocks, and the RDMA device plugin's resource an RDMA overlay gives them.
const RDMA_COMPONENTS = new Set(["prefill", "decode", "cache-store"]);
const RDMA = "rdma/rdma_shared_device_a";

// Kubernetes quantity -> number (bytes or cores); NaN when malformed.
function quantity(q) {
  const m = String(q).match(/^([0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/);
  if (!m) return NaN;
  const mult = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
                 Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
  return Number(m[1]) * (m[2] ? mult[m[2]] : 1);
}
// Tandem byte sizes: integer or KiB/MiB/GiB/TiB, K/M/G/T.
function tandemBytes(v) {
  const m = String(v).match(/^([0-9]+)\s*(KiB|MiB|GiB|TiB|K|M|G|T)?$/);
  if (!m) return NaN;
  const mult = { KiB: 2 ** 10, MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40, K: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(m[1]) * (m[2] ? mult[m[2]] : 1);
}

function matches(selector, labels) {
  const ml = (selector && selector.matchLabels) || {};
  return Object.keys(ml).length > 0 && Object.entries(ml).every(([k, v]) => (labels || {})[k] === v);
}

function checkPolicy(name, objects, errors) {
  const err = (obj, msg) => errors.push(`${obj ? `${obj.kind}/${obj.metadata?.name}` : name}: ${msg}`);
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const workloads = objects.filter((o) => o.kind === "Deployment" || o.kind === "StatefulSet");
  const pdbs = byKind("PodDisruptionBudget");
  const expectGpu = /gpu/.test(name);
  const expectRdma = /rdma/.test(name);
  const seen = new Set();

  for (const w of workloads) {
    const pod = w.spec?.template?.spec || {};
    const labels = w.spec?.template?.metadata?.labels || {};
    const component = labels["app.kubernetes.io/component"];
    const want = COMPONENTS[component];
    if (!want) { err(w, `pod label app.kubernetes.io/component is ${component}, not one of ${Object.keys(COMPONENTS)}`); continue; }
    if (seen.has(component)) err(w, `a second workload for component ${component}`);
    seen.add(component);
    if (w.kind !== want.kind) err(w, `${component} should be a ${want.kind}`);
    for (const [k, v] of [["app.kubernetes.io/name", "tandem"], ["app.kubernetes.io/part-of", "tandem"]]) {
      if (labels[k] !== v) err(w, `pod label ${k} should be ${v}`);
    }
    if (component === "router" && (w.spec.replicas ?? 1) !== 1) {
      err(w, "the router must run exactly 1 replica (workers register with one router)");
    }
    if (!pdbs.some((p) => matches(p.spec?.selector, labels))) err(w, "no PodDisruptionBudget selects its pods");
    const psc = pod.securityContext || {};
    if (psc.seccompProfile?.type !== "RuntimeDefault") err(w, "pod seccompProfile is not RuntimeDefault");
    if (pod.hostNetwork || pod.hostPID || pod.hostIPC) err(w, "uses host namespaces");

    const containers = [...(pod.initContainers || []), ...(pod.containers || [])];
    for (const c of containers) {
      const where = `container ${c.name}`;
      const res = c.resources || {};
      for (const r of ["cpu", "memory"]) {
        if (res.requests?.[r] === undefined || res.limits?.[r] === undefined) {
          err(w, `${where}: needs requests and limits for ${r}`);
        }
      }
      for (const r of new Set([...Object.keys(res.requests || {}), ...Object.keys(res.limits || {})])) {
        const a = quantity(res.requests?.[r]), b = quantity(res.limits?.[r]);
        if (!(a === b)) err(w, `${where}: requests.${r} (${res.requests?.[r]}) != limits.${r} (${res.limits?.[r]}) (Guaranteed QoS)`);
      }
      const gpu = res.limits?.[GPU];
      if (expectGpu && GPU_COMPONENTS.has(component)) {
        if (quantity(gpu) !== 1 || quantity(res.requests?.[GPU]) !== 1) err(w, `${where}: must request and limit ${GPU}: 1`);
      } else if (gpu !== undefined || res.requests?.[GPU] !== undefined) {
        err(w, `${where}: must not request ${GPU} in overlay ${name}`);
      }
      const sc = c.securityContext || {};
      if ((sc.runAsNonRoot ?? psc.runAsNonRoot) !== true) err(w, `${where}: runAsNonRoot is not true`);
      if ((sc.runAsUser ?? psc.runAsUser) !== 10001) err(w, `${where}: runAsUser is not 10001`);
      if (sc.readOnlyRootFilesystem !== true) err(w, `${where}: readOnlyRootFilesystem is not true`);
      if (sc.allowPrivilegeEscalation !== false) err(w, `${where}: allowPrivilegeEscalation is not false`);
      if (sc.privileged) err(w, `${where}: privileged`);
      if (!(sc.capabilities?.drop || []).includes("ALL")) err(w, `${where}: capabilities do not drop ALL`);
      // An RDMA overlay's KV movers may add IPC_LOCK (UCX pins memory for the NIC), nothing else.
      const mayAdd = expectRdma && RDMA_COMPONENTS.has(component) ? ["IPC_LOCK"] : [];
      const added = sc.capabilities?.add || [];
      if (added.some((cap) => !mayAdd.includes(cap))) err(w, `${where}: adds capabilities ${added}`);
      if (expectRdma && RDMA_COMPONENTS.has(component)) {
        if (!added.includes("IPC_LOCK")) err(w, `${where}: needs IPC_LOCK for UCX's registrations`);
        if (quantity(res.limits?.[RDMA]) !== 1) err(w, `${where}: must request and limit ${RDMA}: 1`);
        if (!(c.env || []).some((e) => e.name === "UCX_TLS" && e.value)) err(w, `${where}: needs UCX_TLS`);
      }
      if ((sc.seccompProfile ?? psc.seccompProfile)?.type !== "RuntimeDefault") err(w, `${where}: seccompProfile is not RuntimeDefault`);
    }

    const c = (pod.containers || [])[0];
    if (!c || pod.containers.length !== 1) { err(w, "expects exactly one container"); continue; }
    const ports = Object.fromEntries((c.ports || []).map((p) => [p.name, p.containerPort]));
    if (ports.grpc !== want.port) err(w, `container port grpc should be ${want.port}`);
    if (ports.metrics !== 9090) err(w, "container port metrics should be 9090");
    const args = c.args || [];
    if (args[0] !== component) err(w, `first argument should be the role ${component}, got ${args[0]}`);
    const flag = (f) => { const i = args.indexOf(f); return i >= 0 ? args[i + 1] : undefined; };
    if (flag("--config") !== "/etc/tandem/tandem.yaml") err(w, "--config should be /etc/tandem/tandem.yaml");
    if (flag("--listen") !== `0.0.0.0:${want.port}`) err(w, `--listen should be 0.0.0.0:${want.port}`);
    if (flag("--metrics-listen") !== "0.0.0.0:9090") err(w, "--metrics-listen should be 0.0.0.0:9090");
    if (component === "prefill" || component === "decode") {
      const sets = args.filter((_, i) => args[i - 1] === "--set");
      if (!sets.includes(`${component}.router=tandem-router-registry:8000`)) err(w, `needs --set ${component}.router=tandem-router-registry:8000`);
      if (!sets.includes(`${component}.advertise=$(POD_IP)`)) err(w, `needs --set ${component}.advertise=$(POD_IP) (the listen port is added)`);
      if (!(c.env || []).some((e) => e.name === "POD_IP" && e.valueFrom?.fieldRef?.fieldPath === "status.podIP")) {
        err(w, "needs env POD_IP from status.podIP");
      }
    }
    if (component === "router") {
      // Ready only while it can serve (GET /health on the HTTP door), not merely loaded.
      if (ports.http !== 8080) err(w, "container port http should be 8080");
      if (flag("--http-listen") !== "0.0.0.0:8080") err(w, "--http-listen should be 0.0.0.0:8080");
      const r = c.readinessProbe?.httpGet;
      if (r?.path !== "/health" || (r?.port !== "http" && r?.port !== 8080)) {
        err(w, "readinessProbe should be GET /health on port http");
      }
    }
    if (component === "router" && c.readinessProbe?.httpGet?.scheme !== "HTTPS") {
      err(w, "readinessProbe should use scheme HTTPS (the HTTP door serves TLS)");
    }
    // The ports speak TLS, which the kubelet's gRPC probe cannot: `tandem health` checks them
    // with the pod's own certificate.
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const p = c[probe];
      if (component === "router" && probe === "readinessProbe") continue;
      const cmd = p?.exec?.command || [];
      if (cmd[0] !== "tandem" || cmd[1] !== "health") {
        err(w, `container ${c.name}: ${probe} must exec \`tandem health\``);
        continue;
      }
      const arg = (f) => { const i = cmd.indexOf(f); return i >= 0 ? cmd[i + 1] : undefined; };
      if (arg("--addr") !== `127.0.0.1:${want.port}`) err(w, `${probe} should check 127.0.0.1:${want.port}`);
      if (arg("--config") !== "/etc/tandem/tandem.yaml") err(w, `${probe} needs --config /etc/tandem/tandem.yaml (its certificate)`);
      const svc = arg("--service") ?? "";
      if (probe !== "livenessProbe" && svc !== want.service) err(w, `${probe} should check service ${want.service}`);
      if (probe === "livenessProbe" && svc !== "" && svc !== want.service) err(w, `livenessProbe checks unknown service ${svc}`);
    }
    // Its certificate: the Secret of a Certificate naming this role, at /etc/tandem-tls.
    const tlsMount = (c.volumeMounts || []).find((m) => m.mountPath === "/etc/tandem-tls");
    const tlsVol = tlsMount && (pod.volumes || []).find((v) => v.name === tlsMount.name);
    const role = component === "cache-store" ? "cache_store" : component;
    const cert = byKind("Certificate").find((x) => x.spec?.secretName === tlsVol?.secret?.secretName);
    if (!cert) {
      err(w, "must mount the Secret of a cert-manager Certificate at /etc/tandem-tls");
    } else if (!(cert.spec.uris || []).includes(`spiffe://tandem/${role}`)) {
      err(w, `its certificate ${cert.metadata.name} must carry the URI SAN spiffe://tandem/${role}`);
    } else if (!["server auth", "client auth"].every((u) => (cert.spec.usages || []).includes(u))) {
      err(cert, "usages must include server auth and client auth (mutual TLS)");
    }
    if (component === "router") {
      const keys = (c.volumeMounts || []).find((m) => m.mountPath === "/etc/tandem-api-keys");
      const keyVol = keys && (pod.volumes || []).find((v) => v.name === keys.name);
      if (!keyVol?.secret?.secretName) err(w, "must mount the API-key Secret at /etc/tandem-api-keys");
      const sets = args.filter((_, i) => args[i - 1] === "--set");
      if (!sets.includes("security.api_keys_file=/etc/tandem-api-keys/keys.txt")) {
        err(w, "needs --set security.api_keys_file=/etc/tandem-api-keys/keys.txt");
      }
    }
    // A NetworkPolicy admits its gRPC port.
    const policies = byKind("NetworkPolicy").filter((np) => matches(np.spec?.podSelector, labels));
    if (!policies.some((np) => (np.spec.ingress || []).some((r) => (r.ports || []).some((pt) => pt.port === want.port)))) {
      err(w, `no NetworkPolicy admits its port ${want.port}`);
    }
    const mounts = c.volumeMounts || [];
    const cfg = mounts.find((m) => m.mountPath === "/etc/tandem");
    const vol = cfg && (pod.volumes || []).find((v) => v.name === cfg.name);
    if (!vol?.configMap?.name || !byKind("ConfigMap").some((m) => m.metadata.name === vol.configMap.name)) {
      err(w, "must mount an existing tandem config ConfigMap at /etc/tandem");
    }
    for (const m of mounts) {
      if (!(pod.volumes || []).some((v) => v.name === m.name)) err(w, `volumeMount ${m.name} has no volume`);
    }
  }
  for (const component of Object.keys(COMPONENTS)) {
    if (!seen.has(component)) err(null, `no workload for component ${component}`);
  }
  // Ingress is denied unless a policy admits it, and workers' ports admit only their callers.
  const policies = byKind("NetworkPolicy");
  if (!policies.some((np) => Object.keys(np.spec?.podSelector?.matchLabels || {}).every((k) => k.startsWith("app.kubernetes.io/") && k !== "app.kubernetes.io/component") &&
      (np.spec.policyTypes || []).includes("Ingress") && !(np.spec.ingress || []).length)) {
    err(null, "needs a default-deny ingress NetworkPolicy for every Tandem pod");
  }
  for (const [component, callers] of [["prefill", ["router"]], ["decode", ["router"]], ["cache-store", ["prefill", "decode"]]]) {
    for (const np of policies.filter((x) => x.spec?.podSelector?.matchLabels?.["app.kubernetes.io/component"] === component)) {
      for (const r of np.spec.ingress || []) {
        const from = (r.from || []).map((f) => f.podSelector?.matchLabels?.["app.kubernetes.io/component"]);
        if (!from.length || from.some((f) => !callers.includes(f))) {
          err(np, `${component} should admit only ${callers.join(" and ")} pods`);
        }
      }
    }
  }

  // The shared config.
  const configs = byKind("ConfigMap").filter((m) => m.data?.["tandem.yaml"] !== undefined);
  if (configs.length !== 1) err(null, `expected one ConfigMap with tandem.yaml, found ${configs.length}`);
  const store = workloads.find((w) => w.metadata.name === "tandem-cache-store");
  for (const cm of configs) {
    let config;
    try { config = YAML.parse(cm.data["tandem.yaml"]); } catch (e) { err(cm, `tandem.yaml: ${e.message}`); continue; }
    fs.mkdirSync(path.join(outDir, name), { recursive: true });
    fs.writeFileSync(path.join(outDir, name, "tandem.yaml"), cm.data["tandem.yaml"]);
    const cs = config?.cache_store || {};
    if (store) {
      const n = store.spec.replicas ?? 1, svc = store.spec.serviceName;
      const expected = Array.from({ length: n }, (_, i) => `${store.metadata.name}-${i}.${svc}:${COMPONENTS["cache-store"].port}`);
      if (JSON.stringify(cs.shards) !== JSON.stringify(expected)) {
        err(cm, `cache_store.shards ${JSON.stringify(cs.shards)} should list the StatefulSet's ${n} shards in order: ${JSON.stringify(expected)}`);
      }
      const limit = quantity(store.spec.template.spec.containers[0].resources?.limits?.memory);
      const cap = tandemBytes(cs.capacity_bytes ?? 2 ** 31);
      if (!(cap <= 0.8 * limit)) err(cm, `cache_store.capacity_bytes (${cs.capacity_bytes}) leaves under 20% headroom in the store's memory limit`);
      const headless = byKind("Service").find((s) => s.metadata.name === svc);
      if (!headless || headless.spec.clusterIP !== "None" || headless.spec.publishNotReadyAddresses !== true) {
        err(store, `serviceName ${svc} must be a headless Service with publishNotReadyAddresses`);
      }
    }
    if (cs.shared_memory !== false) err(cm, "cache_store.shared_memory must be false (pods do not share /dev/shm)");
    if (/rdma/.test(name) && cs.transport !== "ucx") err(cm, "cache_store.transport must be ucx in an RDMA overlay");
    const tls = config?.security?.tls || {};
    if (tls.ca_file !== "/etc/tandem-tls/ca.crt" || tls.cert_file !== "/etc/tandem-tls/tls.crt" ||
        tls.key_file !== "/etc/tandem-tls/tls.key") {
      err(cm, "security.tls must name the mounted certificate (/etc/tandem-tls/{ca.crt,tls.crt,tls.key})");
    }
    if (config?.security?.allow_insecure) err(cm, "security.allow_insecure must not be set");
    const router = workloads.find((w) => w.metadata.name === "tandem-router");
    const drain = config?.router?.drain_seconds ?? 30;
    if (router && !((router.spec.template.spec.terminationGracePeriodSeconds ?? 30) > drain)) {
      err(router, `terminationGracePeriodSeconds must exceed router.drain_seconds (${drain})`);
    }
    const kv = tandemBytes(config?.kv_cache?.memory_bytes ?? 2 ** 30);
    for (const w of workloads.filter((x) => ["tandem-prefill", "tandem-decode"].includes(x.metadata.name))) {
      const limits = w.spec.template.spec.containers[0].resources?.limits || {};
      if (limits[GPU] === undefined && !(kv < quantity(limits.memory))) {
        err(w, `kv_cache.memory_bytes (${config.kv_cache?.memory_bytes}) does not fit the memory limit`);
      }
    }
  }

  // Services select pods and name their ports.
  for (const s of byKind("Service")) {
    const target = workloads.find((w) => Object.entries(s.spec.selector || {}).every(
      ([k, v]) => w.spec.template.metadata.labels?.[k] === v));
    if (!target || !Object.keys(s.spec.selector || {}).length) { err(s, "selects no workload's pods"); continue; }
    const names = target.spec.template.spec.containers.flatMap((c) => (c.ports || []).map((p) => p.name));
    for (const p of s.spec.ports || []) {
      if (typeof p.targetPort === "string" && !names.includes(p.targetPort)) err(s, `targetPort ${p.targetPort} is no container port`);
    }
  }
  const routerSvc = byKind("Service").find((s) => s.metadata.name === "tandem-router");
  if (!routerSvc || routerSvc.spec.type !== "ClusterIP" || !routerSvc.spec.ports?.some((p) => p.port === 8000 && p.appProtocol === "grpc") ||
      !routerSvc.spec.ports?.some((p) => p.port === 8080 && p.targetPort === "http")) {
    err(null, "Service tandem-router must be ClusterIP with port 8000 (appProtocol grpc) and 8080 (http)");
  }
  // Workers register before the router is ready (it is ready once they have).
  const registrySvc = byKind("Service").find((s) => s.metadata.name === "tandem-router-registry");
  if (!registrySvc || registrySvc.spec.publishNotReadyAddresses !== true ||
      !registrySvc.spec.ports?.some((p) => p.port === 8000 && p.targetPort === "grpc")) {
    err(null, "Service tandem-router-registry must publish not-ready addresses on port 8000");
  }
  for (const p of pdbs) {
    if (!workloads.some((w) => matches(p.spec.selector, w.spec.template.metadata.labels))) err(p, "selects no workload's pods");
    if (p.spec.minAvailable !== undefined && p.spec.maxUnavailable === undefined) {
      // minAvailable on a 1-replica workload blocks node drains forever.
      const w = workloads.find((x) => matches(p.spec.selector, x.spec.template.metadata.labels));
      if (w && quantity(p.spec.minAvailable) >= (w.spec.replicas ?? 1)) err(p, "minAvailable blocks every eviction");
    }
  }

  // Monitoring: the PodMonitor scrapes every workload's `metrics` port.
  const monitors = byKind("PodMonitor");
  for (const w of workloads) {
    const ok = monitors.some((m) => matches(m.spec.selector, w.spec.template.metadata.labels) &&
      m.spec.podMetricsEndpoints?.some((e) => e.port === "metrics" && (e.path ?? "/metrics") === "/metrics"));
    if (!ok) err(w, "no PodMonitor scrapes its metrics port at /metrics");
  }

  // Autoscaling: HPAs target our Deployments, and prometheus-adapter serves their metrics.
  const adapterCm = byKind("ConfigMap").find((m) => m.data?.["config.yaml"] !== undefined);
  const served = { Pods: new Set(), External: new Set() };
  if (!adapterCm) {
    err(null, "no prometheus-adapter rules ConfigMap (data key config.yaml)");
  } else {
    let rules;
    try { rules = YAML.parse(adapterCm.data["config.yaml"]); } catch (e) { err(adapterCm, `config.yaml: ${e.message}`); }
    for (const [key, kind] of [["rules", "Pods"], ["externalRules", "External"]]) {
      for (const [i, r] of (rules?.[key] || []).entries()) {
        const where = `${key}[${i}]`;
        for (const f of ["seriesQuery", "resources", "metricsQuery"]) if (!r[f]) err(adapterCm, `${where} lacks ${f}`);
        if (!String(r.metricsQuery).includes("<<.Series>>") || !String(r.metricsQuery).includes("<<.LabelMatchers>>")) {
          err(adapterCm, `${where}.metricsQuery should use <<.Series>> and <<.LabelMatchers>>`);
        }
        const overrides = r.resources?.overrides || {};
        if (overrides.namespace?.resource !== "namespace") err(adapterCm, `${where} must map the namespace label`);
        if (kind === "Pods" && overrides.pod?.resource !== "pod") err(adapterCm, `${where} must map the pod label`);
        const series = String(r.seriesQuery).match(/^'?([a-zA-Z_:][a-zA-Z0-9_:]*)/)?.[1];
        served[kind].add(r.name?.as ?? series);
      }
    }
  }
  for (const h of byKind("HorizontalPodAutoscaler")) {
    const t = h.spec.scaleTargetRef;
    if (!workloads.some((w) => w.kind === t.kind && w.metadata.name === t.name)) err(h, `scaleTargetRef ${t.kind}/${t.name} is not in the overlay`);
    if (!(h.spec.minReplicas >= 1 && h.spec.maxReplicas >= h.spec.minReplicas && h.spec.maxReplicas <= 8)) err(h, "replicas bounds should be within 1..8");
    if (!(h.spec.behavior?.scaleDown?.stabilizationWindowSeconds > 0)) err(h, "needs a scale-down stabilization window");
    for (const m of h.spec.metrics || []) {
      const metricName = m.pods?.metric?.name ?? m.external?.metric?.name;
      if ((m.type === "Pods" || m.type === "External") && !served[m.type].has(metricName)) {
        err(h, `${m.type} metric ${metricName} is not served by the prometheus-adapter rules`);
      }
    }
    const w = workloads.find((x) => x.metadata.name === t.name);
    if (w && w.spec.replicas !== undefined) err(w, "replicas is set although an HPA scales it (apply would fight the HPA)");
  }
  for (const c of ["prefill", "decode"]) {
    if (!byKind("HorizontalPodAutoscaler").some((h) => h.spec.scaleTargetRef.name === `tandem-${c}`)) err(null, `no HPA for tandem-${c}`);
  }
}

// ---------------------------------------------------------------------------------------------
let failed = false;
const summary = [];
for (const arg of overlayArgs) {
  const eq = arg.indexOf("=");
  const name = arg.slice(0, eq), file = arg.slice(eq + 1);
  const errors = [];
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  const objects = [];
  for (const doc of docs) {
    if (doc.errors.length) { errors.push(`YAML: ${doc.errors.map((e) => e.message).join("; ")}`); continue; }
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) objects.push(obj);
  }
  for (const obj of objects) {
    const id = `${obj.apiVersion} ${obj.kind} ${obj.metadata?.name}`;
    const model = await loadModel(obj.apiVersion, obj.kind);
    if (!model) { errors.push(`${id}: no schema for this apiVersion/kind (unknown kinds are errors)`); continue; }
    try {
      new model.cls(obj).validate();
    } catch (e) {
      errors.push(`${id}: schema: ${e.message}`);
    }
    const unknown = [];
    checkObject(obj, model.dts, obj.kind, unknown);
    for (const u of unknown) errors.push(`${id}: ${u}`);
  }
  if (objects.length === 0) errors.push("no objects rendered");
  try {
    checkPolicy(name, objects, errors);
  } catch (e) {
    errors.push(`policy check crashed (malformed object?): ${e.stack}`);
  }
  for (const e of errors) console.error(`FAIL [${name}] ${e}`);
  if (errors.length) failed = true;
  summary.push(`${name}: ${objects.length} objects${errors.length ? `, ${errors.length} error(s)` : " ok"}`);
}
console.log(summary.join("; "));
process.exit(failed ? 1 : 0);
