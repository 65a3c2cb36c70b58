"""Checks the deploy manifests (run by tests/docs/deploy_manifests.rs; `update` rewrites them).

    python manifests.py check OUTDIR [ROOT]  # parse, check fields, extract Envoy bootstraps to OUTDIR
    python manifests.py update               # regenerate the Envoy ConfigMaps from envoy/*.yaml

ROOT (default: this repository) holds the files checked: envoy/, deploy/ and
core/src/settings.rs (a test checks copies it broke on purpose).

* Every YAML document under deploy/kubernetes, deploy/istio and deploy/envoy-gateway parses and
  has the fields its kind requires (core kinds are also validated against the Kubernetes JSON
  schemas by kubernetes-validate, from the Rust test).
* The Envoy config in each ConfigMap is envoy/envoy.yaml (envoy/envoy-module.yaml for the
  module's) with the substitutions below, so it cannot drift from the tested one; it is
  written to OUTDIR for `envoy --mode validate`.
* Each Istio EnvoyFilter patch is wrapped in a bootstrap (a filter into an HTTP connection
  manager, a cluster into the clusters, connection manager fields into one) and written to
  OUTDIR, for `envoy --mode validate`; so is what an EnvoyProxy merges into Envoy Gateway's
  bootstrap.
* The routing headers are ours: every Envoy that runs the translation removes a client's
  x-responses-model and x-responses-upstream-model before it routes. The shipped bootstraps
  (envoy/*.yaml, the examples) and the ConfigMaps' have the early header mutation in every
  connection manager a client reaches (an internal listener, which only Envoy reaches, is
  exempt: the module's own Chat requests enter there with the headers it set); each Istio EnvoyFilter that inserts the filter has a NETWORK_FILTER
  patch adding it for the same context; each Gateway an Envoy Gateway policy translates for
  has a ClientTrafficPolicy with earlyRequestHeaders removing them.
* Paths are normalised: every connection manager a client reaches before the translation
  (the same ones as above) sets normalize_path, merge_slashes and an escaped-slash action
  other than KEEP_UNCHANGED, so that no spelling of /v1/responses (/v1/%72esponses,
  //v1/responses, /v1%2Fresponses) steps around the Responses routes; each Gateway an Envoy
  Gateway policy translates for has a ClientTrafficPolicy saying so (path.escapedSlashesAction,
  merged slashes not disabled; Envoy Gateway always sets normalize_path).
* Module mode needs nothing beside Envoy: each module manifest (MODULE_FILES) runs no
  processor and routes nothing to one, takes the WebSocket upgrade on a route where the
  filter is enabled, and defines the cluster its settings name for the transport's Chat
  requests (upstream_cluster, responses_loopback by default).
Prints one line per file written. Needs PyYAML (installed with kubernetes-validate).
"""

import copy
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIRS = ["deploy/kubernetes", "deploy/istio", "deploy/envoy-gateway"]
UPSTREAM = "chat-upstream.default.svc.cluster.local"
PROCESSOR = "responses-extproc.default.svc.cluster.local"
COLLECTOR = "otel-collector.default.svc.cluster.local"

# ConfigMap (file, name) -> (the shipped bootstrap it is, substitutions applied to it, each
# (old, new, count)).
CONFIGMAPS = {
    ("deploy/kubernetes/sidecar.yaml", "responses-envoy"): ("envoy/envoy.yaml", [
        ("                address: 127.0.0.1\n                port_value: 18080",
         f"                address: {UPSTREAM}\n                port_value: 8000", 1),
    ]),
    ("deploy/kubernetes/service.yaml", "responses-envoy"): ("envoy/envoy.yaml", [
        ("                address: 127.0.0.1\n                port_value: 18080",
         f"                address: {UPSTREAM}\n                port_value: 8000", 1),
        ("  - name: extproc\n    type: STATIC\n", "  - name: extproc\n    type: STRICT_DNS\n", 1),
        ("                address: 127.0.0.1\n                port_value: 50051",
         f"                address: {PROCESSOR}\n                port_value: 50051", 1),
        ("  - name: responses_ws\n    type: STATIC\n", "  - name: responses_ws\n    type: STRICT_DNS\n", 1),
        ("                address: 127.0.0.1\n                port_value: 50052",
         f"                address: {PROCESSOR}\n                port_value: 50052", 1),
        # The listener for the processor's own calls, reached from the processor's pods (the
        # NetworkPolicy responses-envoy lets no other pod reach it).
        ("        address: 127.0.0.1\n        port_value: 10001",
         "        address: 0.0.0.0\n        port_value: 10001", 1),
    ]),
    # The module: nothing beside Envoy; the replicas share the sealing keys (a Secret).
    ("deploy/kubernetes/module.yaml", "responses-envoy-module"): ("envoy/envoy-module.yaml", [
        ("                address: 127.0.0.1\n                port_value: 18080",
         f"                address: {UPSTREAM}\n                port_value: 8000", 1),
        ("                value: |\n                  {}\n",
         "                value: |\n                  {\"reasoning_keys_file\": \"/etc/responses-extproc/keys\"}\n", 1),
        # The stat sink's collector (an OpenTelemetry Collector's OTLP/gRPC Service).
        ("                address: 127.0.0.1\n                port_value: 4317",
         f"                address: {COLLECTOR}\n                port_value: 4317", 1),
    ]),
}

REQUIRED = {
    "Deployment": ["spec.selector", "spec.template.spec.containers"],
    "Service": ["spec.ports"],
    "ConfigMap": ["data"],
    "PodDisruptionBudget": ["spec.selector"],
    "NetworkPolicy": ["spec.podSelector"],
    "EnvoyFilter": ["spec.configPatches"],
    "EnvoyExtensionPolicy": ["spec.targetRefs"],
    "EnvoyProxy": ["spec.dynamicModules"],
    "Backend": ["spec.endpoints"],
    "HTTPRoute": ["spec.parentRefs", "spec.rules"],
    "Gateway": ["spec.gatewayClassName", "spec.listeners"],
    "ClientTrafficPolicy": ["spec.targetRefs"],
}

# The module's manifests (module mode: Envoy alone, the WebSocket transport included).
MODULE_FILES = ["deploy/kubernetes/module.yaml", "deploy/istio/envoyfilter-module.yaml",
                "deploy/envoy-gateway/module-policy.yaml"]
DEFAULT_UPSTREAM_CLUSTER = "responses_loopback"

# The request headers the translation sets for routes (the defaults of `model_header` and
# `upstream_model_header`).
MODEL_HEADERS = ["x-responses-model", "x-responses-upstream-model"]
# The HTTP filters that translate: ext_proc (the processor) and the dynamic module.
TRANSLATING_FILTERS = {"envoy.filters.http.ext_proc", "envoy.filters.http.dynamic_modules"}
HCM = "envoy.filters.network.http_connection_manager"
# What a connection manager a client reaches sets so that every spelling of a path is one.
PATH_SETTINGS = {"normalize_path": True, "merge_slashes": True}
ESCAPED_SLASHES = "path_with_escaped_slashes_action"
SAFE_ESCAPED_SLASHES = {"UNESCAPE_AND_REDIRECT", "UNESCAPE_AND_FORWARD", "REJECT_REQUEST"}
SAFE_EG_ESCAPED_SLASHES = {"UnescapeAndRedirect", "UnescapeAndForward", "RejectRequest"}


def expected_envoy(source, subs):
    text = (ROOT / source).read_text()
    for old, new, count in subs:
        if text.count(old) != count:
            sys.exit(f"manifests: {source}: expected {count} of {old!r}")
        text = text.replace(old, new)
    return text


def get(doc, path):
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def docs():
    for d in DIRS:
        for path in sorted((ROOT / d).glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc is not None:
                    yield path.relative_to(ROOT).as_posix(), doc


def bootstrap(listener_filters=None, clusters=None, route_extra=None, hcm_extra=None):
    """A minimal bootstrap around a fragment: an ext_proc filter goes into an HTTP connection
    manager (with a stub of the cluster it names), a cluster into the clusters, route fields
    into its one route, connection manager fields into the connection manager."""
    cluster_name = "extproc"
    for f in listener_filters or []:
        grpc = f.get("typed_config", {}).get("grpc_service", {}).get("envoy_grpc", {})
        cluster_name = grpc.get("cluster_name", cluster_name)
    hcm = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "t",
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": cluster_name}, **(route_extra or {})}]}]},
            "http_filters": (listener_filters or []) + [{
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        },
    }
    for key, value in (hcm_extra or {}).items():
        if key != "@type":
            hcm["typed_config"][key] = value
    extproc = {
        "name": cluster_name, "type": "STATIC",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": cluster_name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 50051}}}}]}]},
    }
    return {"static_resources": {
        "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                       "filter_chains": [{"filters": [hcm]}]}],
        "clusters": (clusters or []) + ([extproc] if not any(c["name"] == cluster_name for c in clusters or []) else []),
    }}


def merged(base, extra):
    """`extra` merged into `base` as Envoy Gateway merges a bootstrap (type: Merge): maps key by
    key, lists appended."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + value
        else:
            out[key] = value
    return out


def dynamic_modules():
    for _, doc in docs():
        if doc.get("kind") == "EnvoyProxy":
            yield doc["spec"]["dynamicModules"]


def check_module_config(file, config):
    """A module config is the processor's settings by their snake_case names: every key must
    be a flag of `responses-extproc` (the module refuses unknown keys too)."""
    help_text = (ROOT / "core/src/settings.rs").read_text()
    for key in config:
        if f"pub {key}:" not in help_text:
            sys.exit(f"manifests: {file}: module config key {key!r} is not a setting")


def module_filter_config(value):
    """The JSON settings of a dynamic module filter (a StringValue), checked like a policy's."""
    config = value.get("typed_config", {}).get("filter_config", {})
    if config.get("@type") == "type.googleapis.com/google.protobuf.StringValue":
        return json.loads(config["value"])
    return {}


def kept_model_headers(hcm):
    """The model headers an HTTP connection manager's typed_config does not remove before it
    routes (with an early header mutation)."""
    removed = set()
    for ext in hcm.get("early_header_mutation_extensions") or []:
        for mutation in ext.get("typed_config", {}).get("mutations") or []:
            removed.add(str(mutation.get("remove", "")).lower())
    return [h for h in MODEL_HEADERS if h not in removed]


def unnormalised_paths(hcm):
    """The path settings an HTTP connection manager's typed_config lacks (empty: none)."""
    missing = [k for k, v in PATH_SETTINGS.items() if hcm.get(k) is not v]
    if hcm.get(ESCAPED_SLASHES) not in SAFE_ESCAPED_SLASHES:
        missing.append(ESCAPED_SLASHES)
    return missing


# The listener of the processor's own Chat requests (envoy/envoy.yaml), which keeps their model
# headers: a client must not reach it.
CALLS_LISTENER = "responses_calls"
CALLS_PORT = 10001


def guards_calls_listener(file_docs):
    """A NetworkPolicy of the Envoy pods lets only the processor's pods reach CALLS_PORT."""
    for d in file_docs:
        if d.get("kind") != "NetworkPolicy":
            continue
        rules = get(d, "spec.ingress") or []
        opening = [r for r in rules if any(p.get("port") == CALLS_PORT for p in r.get("ports", []))]
        if opening and all(
            r.get("from") == [{"podSelector": {"matchLabels": {"app": "responses-extproc"}}}]
            for r in opening
        ) and all(r.get("ports") for r in rules):
            return True
    return False


def check_bootstrap_removes_model_header(name, text, calls_guarded=False):
    """Every HTTP connection manager of a bootstrap a client reaches removes the model headers
    early (an internal listener is reached from inside Envoy only; the processor's listener
    only on loopback, or where a NetworkPolicy admits the processor's pods alone)."""
    listeners = (yaml.safe_load(text).get("static_resources") or {}).get("listeners") or []
    found = 0
    for listener in listeners:
        if "internal_listener" in listener:
            continue
        if listener.get("name") == CALLS_LISTENER:
            address = get(listener, "address.socket_address") or {}
            if address.get("port_value") != CALLS_PORT:
                sys.exit(f"manifests: {name}: listener {CALLS_LISTENER} is not on port {CALLS_PORT}")
            if address.get("address") == "127.0.0.1" or calls_guarded:
                continue
            sys.exit(f"manifests: {name}: listener {CALLS_LISTENER} keeps the model headers and "
                     "is reachable beyond loopback without a NetworkPolicy for the processor alone")
        for chain in listener.get("filter_chains") or []:
            for f in chain.get("filters") or []:
                if f.get("name") == HCM:
                    found += 1
                    kept = kept_model_headers(f.get("typed_config", {}))
                    if kept:
                        sys.exit(f"manifests: {name}: listener {listener.get('name')} does not "
                                 f"remove {', '.join(kept)} before routing "
                                 "(early_header_mutation_extensions)")
                    missing = unnormalised_paths(f.get("typed_config", {}))
                    if missing:
                        sys.exit(f"manifests: {name}: listener {listener.get('name')} does not "
                                 f"normalise paths: {', '.join(missing)}")
    if not found:
        sys.exit(f"manifests: {name}: no HTTP connection manager")


def shipped_bootstraps():
    """The Envoy bootstraps shipped beside the manifests: envoy/*.yaml and the full examples."""
    for path in sorted((ROOT / "envoy").glob("*.yaml")) + sorted((ROOT / "envoy/examples").glob("*.yaml")):
        text = path.read_text()
        if "static_resources" in (yaml.safe_load(text) or {}):
            yield path.relative_to(ROOT).as_posix(), text


def check_envoyfilter_removes_model_header(file, doc):
    """An EnvoyFilter that inserts a translating filter also removes the model headers early, in
    the same context (gateway, sidecar)."""
    patches = doc["spec"]["configPatches"]
    contexts = {p["match"].get("context") for p in patches
                if p["applyTo"] == "HTTP_FILTER" and p["patch"]["value"].get("name") in TRANSLATING_FILTERS}
    for context in contexts:
        kept = set(MODEL_HEADERS)
        for p in patches:
            if p["applyTo"] == "NETWORK_FILTER" and p["match"].get("context") == context:
                kept &= set(kept_model_headers(p["patch"]["value"].get("typed_config", {})))
        if kept:
            sys.exit(f"manifests: {file}: EnvoyFilter {doc['metadata']['name']} translates in "
                     f"{context} but does not remove {', '.join(sorted(kept))} there before "
                     "routing (a NETWORK_FILTER patch with early_header_mutation_extensions)")
        missing = set(unnormalised_paths({}))
        for p in patches:
            if p["applyTo"] == "NETWORK_FILTER" and p["match"].get("context") == context:
                missing &= set(unnormalised_paths(p["patch"]["value"].get("typed_config", {})))
        if missing:
            sys.exit(f"manifests: {file}: EnvoyFilter {doc['metadata']['name']} translates in "
                     f"{context} but does not normalise paths there: {', '.join(sorted(missing))} "
                     "(a NETWORK_FILTER patch)")


def check_gateways_remove_model_header():
    """Each Gateway an Envoy Gateway policy translates for (through the HTTPRoutes it targets)
    has a ClientTrafficPolicy removing the model headers early; per file (each is applied on
    its own)."""
    by_file = {}
    for file, doc in docs():
        by_file.setdefault(file, []).append(doc)
    for file, file_docs in by_file.items():
        routes = {d["metadata"]["name"]: d for d in file_docs if d.get("kind") == "HTTPRoute"}
        gateways = set()
        for d in file_docs:
            if d.get("kind") != "EnvoyExtensionPolicy":
                continue
            for ref in d["spec"]["targetRefs"]:
                route = routes.get(ref["name"]) if ref.get("kind") == "HTTPRoute" else None
                if route is None:
                    sys.exit(f"manifests: {file}: {d['metadata']['name']} targets {ref}, not an HTTPRoute of this file")
                gateways.update(p["name"] for p in route["spec"]["parentRefs"])
        for gateway in sorted(gateways):
            kept = set(MODEL_HEADERS)
            for d in file_docs:
                if d.get("kind") == "ClientTrafficPolicy" and any(
                        r.get("kind") == "Gateway" and r.get("name") == gateway
                        for r in d["spec"]["targetRefs"]):
                    kept -= {h.lower() for h in get(d, "spec.headers.earlyRequestHeaders.remove") or []}
            if kept:
                sys.exit(f"manifests: {file}: Gateway {gateway} translates but no ClientTrafficPolicy "
                         f"removes {', '.join(sorted(kept))} before routing (headers.earlyRequestHeaders)")
            if not any(d.get("kind") == "ClientTrafficPolicy"
                       and any(r.get("kind") == "Gateway" and r.get("name") == gateway
                               for r in d["spec"]["targetRefs"])
                       and get(d, "spec.path.escapedSlashesAction") in SAFE_EG_ESCAPED_SLASHES
                       and get(d, "spec.path.disableMergeSlashes") is not True
                       for d in file_docs):
                sys.exit(f"manifests: {file}: Gateway {gateway} translates but no ClientTrafficPolicy "
                         "normalises its paths (path.escapedSlashesAction, path.disableMergeSlashes)")


def check_module_alone():
    """See MODULE_FILES."""
    for file in MODULE_FILES:
        text = (ROOT / file).read_text()
        file_docs = [d for d in yaml.safe_load_all(text) if d]
        if "responses-extproc." in text or "50051" in text or "50052" in text:
            sys.exit(f"manifests: {file}: module mode sends something to a processor")
        for d in file_docs:
            for c in get(d, "spec.template.spec.containers") or []:
                if "responses-extproc" in c.get("image", ""):
                    sys.exit(f"manifests: {file}: module mode runs a processor ({c['name']})")
        clusters, settings, upgrade_enabled = set(), [], False
        for d in file_docs:
            kind = d.get("kind")
            if kind == "ConfigMap" and "envoy.yaml" in d.get("data", {}):
                envoy = yaml.safe_load(d["data"]["envoy.yaml"])
                clusters |= {c["name"] for c in envoy["static_resources"]["clusters"]}
                for listener in envoy["static_resources"]["listeners"]:
                    for chain in listener.get("filter_chains") or []:
                        for f in chain["filters"]:
                            hcm = f.get("typed_config", {})
                            for http in hcm.get("http_filters") or []:
                                if http["name"] == "envoy.filters.http.dynamic_modules":
                                    settings.append(module_filter_config(http))
                            for vh in get(hcm, "route_config.virtual_hosts") or []:
                                for r in vh["routes"]:
                                    upgrade = any(h["name"] == "upgrade" for h in r["match"].get("headers", []))
                                    enabled = get(r, "typed_per_filter_config") or {}
                                    upgrade_enabled |= upgrade and "envoy.filters.http.dynamic_modules" in enabled
            if kind == "EnvoyFilter":
                routes = set()
                for p in d["spec"]["configPatches"]:
                    value = p["patch"]["value"]
                    if p["applyTo"] == "CLUSTER":
                        clusters.add(value["name"])
                    if p["applyTo"] == "HTTP_FILTER":
                        settings.append(module_filter_config(value))
                    if p["applyTo"] == "HTTP_ROUTE" and "envoy.filters.http.dynamic_modules" in value.get("typed_per_filter_config", {}):
                        routes.add(p["match"]["routeConfiguration"]["vhost"]["route"]["name"])
                for vs in file_docs:
                    for r in get(vs, "spec.http") if vs.get("kind") == "VirtualService" else []:
                        if r.get("name") in routes and any("upgrade" in (m.get("headers") or {}) for m in r.get("match", [])):
                            upgrade_enabled = True
            if kind == "EnvoyProxy" and get(d, "spec.bootstrap.value"):
                b = yaml.safe_load(d["spec"]["bootstrap"]["value"])
                clusters |= {c["name"] for c in get(b, "static_resources.clusters") or []}
            if kind == "EnvoyExtensionPolicy":
                targets = {r["name"] for r in d["spec"]["targetRefs"] if r.get("kind") == "HTTPRoute"}
                for dm in get(d, "spec.dynamicModule") or []:
                    settings.append(dm.get("config") or {})
                for route in file_docs:
                    if route.get("kind") == "HTTPRoute" and route["metadata"]["name"] in targets:
                        for rule in route["spec"]["rules"]:
                            for m in rule.get("matches", []):
                                if any(h["name"].lower() == "upgrade" for h in m.get("headers", [])):
                                    upgrade_enabled = True
        if not upgrade_enabled:
            sys.exit(f"manifests: {file}: no WebSocket upgrade route with the module enabled")
        if not settings:
            sys.exit(f"manifests: {file}: no module filter settings found")
        for config in settings:
            cluster = config.get("upstream_cluster", DEFAULT_UPSTREAM_CLUSTER)
            if cluster not in clusters:
                sys.exit(f"manifests: {file}: the module's upstream_cluster {cluster} is not defined there")


def check(out):
    out = pathlib.Path(out)
    kinds = {}
    seen_configmaps = set()
    for name, text in shipped_bootstraps():
        check_bootstrap_removes_model_header(name, text)
    check_gateways_remove_model_header()
    check_module_alone()
    for file, doc in docs():
        kind = doc.get("kind")
        for field in ["apiVersion", "kind", "metadata.name"]:
            if get(doc, field) is None:
                sys.exit(f"manifests: {file}: a document without {field}")
        name = doc["metadata"]["name"]
        for field in REQUIRED.get(kind, []):
            if get(doc, field) is None:
                sys.exit(f"manifests: {file}: {kind} {doc['metadata']['name']} has no {field}")
        if kind == "EnvoyExtensionPolicy":
            policies = [k for k in ("extProc", "dynamicModule") if get(doc, f"spec.{k}")]
            if len(policies) != 1:
                sys.exit(f"manifests: {file}: {name}: one of spec.extProc, spec.dynamicModule")
            for dm in get(doc, "spec.dynamicModule") or []:
                modules = {m["name"] for d in dynamic_modules() for m in d}
                if dm["name"] not in modules:
                    sys.exit(f"manifests: {file}: {name} names module {dm['name']}, not in any EnvoyProxy")
                check_module_config(file, dm.get("config", {}))
        kinds.setdefault(kind, 0)
        kinds[kind] += 1
        if kind == "ConfigMap" and "envoy.yaml" in doc["data"]:
            key = (file, name)
            if key not in CONFIGMAPS:
                sys.exit(f"manifests: {file}: ConfigMap {name} is not known to manifests.py")
            file_docs = [d for d in yaml.safe_load_all((ROOT / file).read_text()) if d]
            check_bootstrap_removes_model_header(f"{file}: ConfigMap {name}", doc["data"]["envoy.yaml"],
                                                 guards_calls_listener(file_docs))
            source, subs = CONFIGMAPS[key]
            if doc["data"]["envoy.yaml"] != expected_envoy(source, subs):
                sys.exit(f"manifests: {file}: ConfigMap {name} differs from {source} "
                         "with its substitutions: run `python tests/deploy/manifests.py update`")
            seen_configmaps.add(key)
            target = out / f"{pathlib.Path(file).stem}-{name}.yaml"
            target.write_text(doc["data"]["envoy.yaml"])
            print(target)
        if kind == "EnvoyProxy" and get(doc, "spec.bootstrap.value"):
            # What the EnvoyProxy merges into Envoy Gateway's bootstrap, in a bootstrap of ours.
            b = merged(bootstrap(), yaml.safe_load(doc["spec"]["bootstrap"]["value"]))
            target = out / f"{pathlib.Path(file).stem}-{name}-bootstrap.json"
            target.write_text(json.dumps(b))
            print(target)
        if kind == "EnvoyFilter":
            check_envoyfilter_removes_model_header(file, doc)
            for i, p in enumerate(doc["spec"]["configPatches"]):
                value = p["patch"]["value"]
                if p["applyTo"] == "HTTP_FILTER":
                    check_module_config(file, module_filter_config(value))
                    b = bootstrap(listener_filters=[value])
                elif p["applyTo"] == "CLUSTER":
                    b = bootstrap(clusters=[value])
                elif p["applyTo"] == "HTTP_ROUTE":
                    b = bootstrap(route_extra=value)
                elif p["applyTo"] == "NETWORK_FILTER" and p["match"]["listener"]["filterChain"]["filter"]["name"] == HCM:
                    b = bootstrap(hcm_extra=value["typed_config"])
                elif p["applyTo"] == "BOOTSTRAP" and p["patch"]["operation"] == "MERGE":
                    b = merged(bootstrap(), value)
                else:
                    sys.exit(f"manifests: {file}: patch {i} applies to {p['applyTo']}, not checked")
                target = out / f"{pathlib.Path(file).stem}-{name}-{i}.json"
                target.write_text(json.dumps(b))
                print(target)
    missing = set(CONFIGMAPS) - seen_configmaps
    if missing:
        sys.exit(f"manifests: ConfigMaps not found: {missing}")
    print("kinds: " + json.dumps(kinds, sort_keys=True), file=sys.stderr)


def update():
    for (file, name), (source, subs) in CONFIGMAPS.items():
        path = ROOT / file
        text = path.read_text()
        body = "    " + expected_envoy(source, subs).replace("\n", "\n    ").rstrip() + "\n"
        start = text.index("  envoy.yaml: |\n") + len("  envoy.yaml: |\n")
        end = text.index("\n---\n", start) + 1
        path.write_text(text[:start] + body + text[end:])
        print(f"updated {file}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        if len(sys.argv) > 3:
            ROOT = pathlib.Path(sys.argv[3]).resolve()
        check(sys.argv[2])
    elif sys.argv[1:2] == ["update"]:
        update()
    else:
        sys.exit(__doc__)
