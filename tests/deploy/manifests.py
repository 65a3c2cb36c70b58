"""Checks the deploy manifests (run by tests/deploy_manifests.rs; `update` rewrites them).

    python manifests.py check OUTDIR   # parse, check fields, extract Envoy bootstraps to OUTDIR
    python manifests.py update         # regenerate the Envoy ConfigMaps from envoy/envoy.yaml

* Every YAML document under deploy/kubernetes, deploy/istio and deploy/envoy-gateway parses and
  has the fields its kind requires (core kinds are also validated against the Kubernetes JSON
  schemas by kubernetes-validate, from the Rust test).
* The Envoy config in each ConfigMap is envoy/envoy.yaml with the substitutions below, so it
  cannot drift from the tested one; it is written to OUTDIR for `envoy --mode validate`.
* Each Istio EnvoyFilter patch is wrapped in a bootstrap (a filter into an HTTP connection
  manager, a cluster into the clusters) and written to OUTDIR, for `envoy --mode validate`;
  so is what an EnvoyProxy merges into Envoy Gateway's bootstrap.
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

# ConfigMap (file, name) -> substitutions applied to envoy/envoy.yaml, each (old, new, count).
CONFIGMAPS = {
    ("deploy/kubernetes/sidecar.yaml", "responses-envoy"): [
        ("                address: 127.0.0.1\n                port_value: 18080",
         f"                address: {UPSTREAM}\n                port_value: 8000", 1),
    ],
    ("deploy/kubernetes/service.yaml", "responses-envoy"): [
        ("                address: 127.0.0.1\n                port_value: 18080",
         f"                address: {UPSTREAM}\n                port_value: 8000", 1),
        ("  - name: extproc\n    type: STATIC\n", "  - name: extproc\n    type: STRICT_DNS\n", 1),
        ("                address: 127.0.0.1\n                port_value: 50051",
         f"                address: {PROCESSOR}\n                port_value: 50051", 1),
        ("  - name: responses_ws\n    type: STATIC\n", "  - name: responses_ws\n    type: STRICT_DNS\n", 1),
        ("                address: 127.0.0.1\n                port_value: 50052",
         f"                address: {PROCESSOR}\n                port_value: 50052", 1),
    ],
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
}


def expected_envoy(subs):
    text = (ROOT / "envoy/envoy.yaml").read_text()
    for old, new, count in subs:
        if text.count(old) != count:
            sys.exit(f"manifests: envoy/envoy.yaml: expected {count} of {old!r}")
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


def bootstrap(listener_filters=None, clusters=None, route_extra=None):
    """A minimal bootstrap around a fragment: an ext_proc filter goes into an HTTP connection
    manager (with a stub of the cluster it names), a cluster into the clusters, route fields
    into its one route."""
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


def check(out):
    out = pathlib.Path(out)
    kinds = {}
    seen_configmaps = set()
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
            if doc["data"]["envoy.yaml"] != expected_envoy(CONFIGMAPS[key]):
                sys.exit(f"manifests: {file}: ConfigMap {name} differs from envoy/envoy.yaml "
                         "with its substitutions: run `python tests/deploy/manifests.py update`")
            seen_configmaps.add(key)
            target = out / f"{pathlib.Path(file).stem}-{name}.yaml"
            target.write_text(doc["data"]["envoy.yaml"])
            print(target)
        if kind == "EnvoyProxy" and get(doc, "spec.bootstrap.value"):
            # What the EnvoyProxy merges into Envoy Gateway's bootstrap, in a bootstrap of ours.
            b = {**bootstrap(), **yaml.safe_load(doc["spec"]["bootstrap"]["value"])}
            target = out / f"{pathlib.Path(file).stem}-{name}-bootstrap.json"
            target.write_text(json.dumps(b))
            print(target)
        if kind == "EnvoyFilter":
            for i, p in enumerate(doc["spec"]["configPatches"]):
                value = p["patch"]["value"]
                if p["applyTo"] == "HTTP_FILTER":
                    check_module_config(file, module_filter_config(value))
                    b = bootstrap(listener_filters=[value])
                elif p["applyTo"] == "CLUSTER":
                    b = bootstrap(clusters=[value])
                elif p["applyTo"] == "HTTP_ROUTE":
                    b = bootstrap(route_extra=value)
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
    for (file, name), subs in CONFIGMAPS.items():
        path = ROOT / file
        text = path.read_text()
        body = "    " + expected_envoy(subs).replace("\n", "\n    ").rstrip() + "\n"
        start = text.index("  envoy.yaml: |\n") + len("  envoy.yaml: |\n")
        end = text.index("\n---\n", start) + 1
        path.write_text(text[:start] + body + text[end:])
        print(f"updated {file}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        check(sys.argv[2])
    elif sys.argv[1:2] == ["update"]:
        update()
    else:
        sys.exit(__doc__)
