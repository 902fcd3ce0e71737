"""deploy/k8s (docs/scale-out.md#4-kubernetes) holds manifests no cluster here ever applies, so
this module checks what can be checked without one: every document against the Kubernetes
OpenAPI schemas (``kubernetes-validate``, strict: unknown fields are errors), a few rules the
API server adds to the schemas, that ``kustomization.yaml`` lists every manifest, that no
manifest holds a secret, that every ``autotune`` command line in a container parses with
autotune's own command line, and that the configs they name load with autotune's loaders.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer.main
import yaml
from support.services import need_service

from autotune.cli import app
from autotune.config import parse_config
from autotune.nightly.job_config import load_nightly_config

K8S = Path(__file__).parents[1] / "deploy" / "k8s"
# the oldest Kubernetes the manifests are for (podFailurePolicy is GA from 1.31) and the
# newest the schemas bundled with kubernetes-validate know
OLDEST = "1.31.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every manifest document of the folder."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                out.append((path.name, doc))
    return out


DOCS = documents()


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in DOCS if d["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def pod_template(doc: dict[str, Any]) -> dict[str, Any] | None:
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "Job"):
        return spec["template"]
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]
    return None


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    template = pod_template(doc)
    if template is not None:
        yield from template["spec"].get("initContainers", [])
        yield from template["spec"]["containers"]


def kubernetes_validate() -> Any:
    try:
        import kubernetes_validate as kv
    except ImportError as exc:
        need_service("kubernetes-validate", False, f"{exc} (pip install -e '.[test]')")
    return kv


# -- the schemas ------------------------------------------------------------------------------


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    kv = kubernetes_validate()
    failures = []
    for version in (OLDEST, kv.latest_version()):
        for name, doc in DOCS:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                failures.append(f"{name} {doc['kind']} ({version}): {where}: {exc.message}")
            except kv.SchemaNotFoundError as exc:  # an unknown kind or apiVersion
                failures.append(f"{name}: {exc.message}")
    assert not failures, "\n".join(failures)
    kinds = {d["kind"] for _, d in DOCS}
    assert {"StatefulSet", "Job", "CronJob", "Deployment", "NetworkPolicy"} <= kinds


@pytest.mark.parametrize(
    ("break_it", "words"),
    [
        (lambda d: d["spec"].update(replicas="two"), "'two' is not of type 'integer'"),
        # strict: a field Kubernetes does not know would be dropped by a lenient check
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(gpus=1), "'gpus'"),
    ],
    ids=["replicas-as-text", "unknown-field"],
)
def test_the_schema_check_rejects_a_broken_manifest(break_it: Any, words: str) -> None:
    kv = kubernetes_validate()
    broken = copy.deepcopy(one("Deployment", "autotune-dashboard"))
    break_it(broken)
    with pytest.raises(kv.ValidationError) as info:
        kv.validate(broken, OLDEST, strict=True)
    assert words in info.value.message


def test_rules_the_api_server_adds_to_the_schemas() -> None:
    """Rules the OpenAPI schemas do not carry, which the API server enforces at apply."""
    for _, doc in DOCS:
        template = pod_template(doc)
        if template is None:
            continue
        labels = template["metadata"]["labels"]
        selector = doc["spec"].get("selector", {}).get("matchLabels")
        if selector is not None:  # a workload's selector must select its own pods
            assert selector.items() <= labels.items(), doc["metadata"]["name"]
        if doc["kind"] in ("Job", "CronJob"):
            job = doc["spec"] if doc["kind"] == "Job" else doc["spec"]["jobTemplate"]["spec"]
            assert template["spec"]["restartPolicy"] in ("Never", "OnFailure")
            if "podFailurePolicy" in job:
                assert template["spec"]["restartPolicy"] == "Never"
            if "backoffLimitPerIndex" in job:
                assert job["completionMode"] == "Indexed"
        for c in containers(doc):
            gpus = c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu")
            assert gpus is None or gpus == c["resources"]["limits"]["nvidia.com/gpu"]
    pods = [pod_template(d)["metadata"]["labels"] for _, d in DOCS if pod_template(d)]
    for svc in by_kind("Service"):  # every Service selects some pod of the folder
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc


# -- kustomization, secrets -------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(k["resources"]) == sorted(files)
    assert len(k["resources"]) == len(set(k["resources"]))
    assert not list(K8S.glob("*.yml")) and not [p for p in K8S.iterdir() if p.is_dir()]
    assert k["namespace"] == one("Namespace", "autotune")["metadata"]["name"]
    assert all("namespace" not in d["metadata"] for _, d in DOCS)  # the kustomization's


SECRET_ENV = re.compile(r"(PASSWORD|TOKEN|SECRET|API_KEY|DATABASE_URL)$")
URL_WITH_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)
    elif isinstance(node, str):
        yield node


def secret_findings(doc: dict[str, Any]) -> list[str]:
    """What in ``doc`` is a secret written out: a Secret object, a URL with a password, a
    secret-named variable with a literal value instead of a secretKeyRef."""
    found = []
    if doc["kind"] == "Secret":
        found.append(f"Secret {doc['metadata']['name']} (create it with kubectl instead)")
    found += [f"a URL with a password: {s!r}" for s in strings(doc) if URL_WITH_PASSWORD.search(s)]
    for c in containers(doc):
        for env in c.get("env", []):
            if SECRET_ENV.search(env["name"]) and "secretKeyRef" not in env.get("valueFrom", {}):
                found.append(f"{c['name']}: {env['name']} is not from a Secret")
    return found


def test_no_manifest_holds_a_secret() -> None:
    for name, doc in DOCS:
        assert secret_findings(doc) == [], name
    refs = {
        (env["valueFrom"]["secretKeyRef"]["name"], env["valueFrom"]["secretKeyRef"]["key"])
        for _, doc in DOCS
        for c in containers(doc)
        for env in c.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    # what docs/scale-out.md tells the reader to create
    assert refs == {
        ("autotune-db", "password"),
        ("autotune-db", "url"),
        ("autotune-api", "token"),
        ("autotune-hf", "token"),
    }


def test_the_secret_check_finds_a_written_out_secret() -> None:
    doc = copy.deepcopy(one("StatefulSet", "autotune-postgres"))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "POSTGRES_PASSWORD", "value": "hunter2"}]
    container["args"] = ["postgresql+psycopg://autotune:hunter2@autotune-postgres:5432/autotune"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "autotune-db"}}
    assert len(secret_findings(doc)) == 2 and len(secret_findings(secret)) == 1


# -- the command lines ------------------------------------------------------------------------


def _is_operator(token: str) -> bool:
    return set(token) <= set("();<>|&")


def autotune_argvs(container: dict[str, Any]) -> list[list[str]]:
    """Every ``autotune`` invocation of a container: its command line, or each one in its
    ``sh -c`` script (up to the next operator or redirection), variables expanded from the
    container's literal env values, as Kubernetes and the shell would."""
    argv = [*container.get("command", []), *container.get("args", [])]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    calls: list[list[str]] = []
    if argv[:2] in (["sh", "-c"], ["bash", "-c"]):
        for line in argv[2].splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            tokens = list(lex)
            for i, tok in enumerate(tokens):
                if PurePosixPath(tok).name == "autotune":
                    end = next(
                        (j for j in range(i + 1, len(tokens)) if _is_operator(tokens[j])), None
                    )
                    calls.append(tokens[i + 1 : end])
    elif argv and PurePosixPath(argv[0]).name == "autotune":
        calls.append(argv[1:])

    def expand(arg: str) -> str:
        out = re.sub(
            r"\$\((\w+)\)|\$\{(\w+)\}|\$(\w+)", lambda m: env[next(g for g in m.groups() if g)], arg
        )
        assert "$" not in out, arg
        return out

    return [[expand(a) for a in call] for call in calls]


ROOT_COMMAND = typer.main.get_command(app)
# Click's UsageError, from the Click typer uses (it vendors one from 0.25 on)
USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def parse(argv: list[str]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The subcommand path and parameters ``autotune ARGV`` parses to, as ``autotune`` itself
    parses them (Click, not resilient: a usage error raises), without running anything."""
    ctx = ROOT_COMMAND.make_context("autotune", list(argv), resilient_parsing=False)
    cmd, path = ROOT_COMMAND, []
    while hasattr(cmd, "commands"):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            assert getattr(cmd, "invoke_without_command", False), f"{argv}: no subcommand"
            break
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        cmd, path = sub, [*path, name]
    return tuple(path), ctx.params


def test_every_autotune_command_line_parses_with_autotunes_cli() -> None:
    study = yaml.safe_load(one("ConfigMap", "autotune-study")["data"]["study.yaml"])
    seen = set()
    for name, doc in DOCS:
        for c in containers(doc):
            for argv in autotune_argvs(c):
                path, params = parse(argv)  # a usage error fails the test here
                seen.add(path)
                if path in (("study", "show"), ("study", "run")):  # the study create creates
                    assert params["name"] == study["name"], (name, argv)
                if path == ("study", "run"):
                    assert params["gpus"] == "all"  # each pod runs on the GPUs it was given
    assert seen == {
        ("db", "upgrade"),
        ("study", "show"),
        ("study", "create"),
        ("study", "run"),
        ("serve",),
        ("nightly",),
    }


@pytest.mark.parametrize(
    "line",
    [
        "autotune study run chat-8b --gpu all",  # a misspelt option
        "autotune study run chat-8b --gpus-per-trial zero",  # a bad value
        "autotune stduy run chat-8b",  # a misspelt command
    ],
)
def test_the_command_line_check_rejects_a_bad_line(line: str) -> None:
    container = {"name": "c", "command": ["sh", "-c"], "args": [f"{line} >/dev/null; exit 0"]}
    (argv,) = autotune_argvs(container)
    assert argv == line.split()[1:]
    with pytest.raises(USAGE_ERROR):
        parse(argv)


# -- what the command lines name --------------------------------------------------------------


def mounted_file(doc: dict[str, Any], container: dict[str, Any], path: str) -> str:
    """The text of ``path`` in ``container``: a key of a ConfigMap mounted at its folder."""
    p = PurePosixPath(path)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(p.parent)]
    volumes = pod_template(doc)["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    return one("ConfigMap", volume["configMap"]["name"])["data"][p.name]


def test_the_configs_the_command_lines_name_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = set()
    for _, doc in DOCS:
        for c in containers(doc):
            for env in c.get("env", []):
                if "value" in env:
                    monkeypatch.setenv(env["name"], env["value"])
            for argv in autotune_argvs(c):
                path, params = parse(argv)
                if path == ("study", "create"):
                    text = mounted_file(doc, c, params["config"])
                    cfg = parse_config(text, params["config"])
                    assert cfg.worker.kind == "vllm" and cfg.worker.gpus is None  # --gpus all
                    loaded.add(path)
                elif path == ("nightly",):
                    file = tmp_path / "nightly.yaml"
                    file.write_text(mounted_file(doc, c, params["config"]), encoding="utf-8")
                    nightly = load_nightly_config(file)
                    assert nightly.output == "/deploy/chat-prod.yaml"
                    loaded.add(path)
    assert loaded == {("study", "create"), ("nightly",)}


# -- the database stays in the namespace -----------------------------------------------------


def test_only_this_apps_pods_in_the_namespace_reach_postgres() -> None:
    policy = one("NetworkPolicy", "autotune-postgres")["spec"]
    postgres = one("StatefulSet", "autotune-postgres")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= postgres["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]  # no namespaceSelector, no ipBlock: this namespace's pods only
    assert set(source) == {"podSelector"}
    allowed = source["podSelector"]["matchLabels"]
    (port,) = rule["ports"]
    (pg_port,) = postgres["spec"]["containers"][0]["ports"]
    assert (port["protocol"], port["port"]) == ("TCP", pg_port["containerPort"]) == ("TCP", 5432)
    # every pod that holds the database URL is one the policy lets in
    clients = 0
    for _, doc in DOCS:
        if any(
            e["name"] == "AUTOTUNE_DATABASE_URL" for c in containers(doc) for e in c.get("env", [])
        ):
            clients += 1
            labels = pod_template(doc)["metadata"]["labels"]
            assert allowed.items() <= labels.items(), doc["metadata"]["name"]
    assert clients == 5  # create, controllers, dashboard, API, nightly


def test_the_controllers_are_an_indexed_job_each_pod_with_its_gpus() -> None:
    job = one("Job", "autotune-study-run")["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] >= 2
    controller = next(c for c in job["template"]["spec"]["containers"] if c["name"] == "controller")
    assert int(controller["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    (argv,) = autotune_argvs(controller)
    assert argv[-2:] == ["--gpus", "all"]
