"""The Helm chart (deployments/helm/compute-domain-driver) against config/default and upstream.

With default values ``helm template`` must render the objects ``kubectl kustomize config/default``
renders, apart from what docs/operators.md lists (Helm's own labels, the ConfigMap name's hash,
no Namespace object, and the IMEX/clique env the chart always renders while config/ lacks it).
Upstream's value names must reach the objects they name; upstream's fail-fast messages for
``resources.computeDomains.imex`` must be upstream's text; every value this driver cannot honour
must be refused with a message naming it; the release namespace must reach the admission
policies; the driver root is one value; host-managed mode renders config/default with
config/components/host-managed-imex; an operator's values file written for upstream's chart
renders; and the controller's and plugin's own parsers accept every env the chart renders.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from testsupport.helmchart import (
    CHART,
    CONFIG,
    NS,
    RELEASE,
    REPO,
    Obj,
    container,
    env,
    find,
    kustomize,
    refusal,
    run_helm,
    template,
    without_config_hash,
)

from pkg.featuregates import FeatureGates
from pkg.imex.mode import ImexModeConfig
from pkg.kubeletplugin.options import parse_args as parse_plugin_args
from pkg.reconcilers.flags import parse_options

# Labels the chart adds to every templated top-level object (never to pod templates or
# selectors; not to the CRDs, which Helm installs from crds/ verbatim).
# Upstream's chart defaults, GPUs off: an operator's existing values file.
UPSTREAM_VALUES = CHART / "ci" / "upstream-operator-values.yaml"
HELM_ONLY_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}
# Env the chart always renders (upstream's chart does), with the binaries' defaults; config/
# renders them too once it sets them, and then they must be equal.
CHART_ONLY_ENV = {
    "compute-domain-controller": {"IMEX_MODE": "driverManaged", "IMEX_ISOLATION": "domain"},
    "compute-domain-kubelet-plugin": {
        "IMEX_MODE": "driverManaged",
        "IMEX_ISOLATION": "domain",
        "IMEX_HOST_SOCKET_PATH": "/etc/nvidia-imex/imex_ctrl.sock",
        "GPU_CLIQUE_LABEL_ENABLED": "false",
    },
}
WORKLOADS = {
    "compute-domain-controller": "Deployment",
    "compute-domain-kubelet-plugin": "DaemonSet",
}
# Left out in host-managed IMEX mode (no driver-run daemons), as upstream's chart leaves out the
# first four and config/components/host-managed-imex all ten.
DAEMON_OBJECTS = {
    ("ServiceAccount", "compute-domain-daemon"),
    ("Role", "compute-domain-daemon"),
    ("RoleBinding", "compute-domain-daemon"),
    ("DeviceClass", "compute-domain-daemon.nvidia.com"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-pods"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-pods"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-cliques"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-cliques"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-device-claims"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-device-claims"),
}
HOST_MANAGED = (
    "resources.computeDomains.imex.mode=hostManaged",
    "featureGates.HostManagedIMEXDaemon=true",
)


def keyed(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    """Objects by (kind, name), the ConfigMap's hash suffix replaced."""
    out = {(o["kind"], o["metadata"]["name"]): o for o in without_config_hash(objs)}
    assert len(out) == len(objs), "two objects of one kind share a name"
    return out


def comparable(objs: list[Obj], *, chart: bool) -> dict[tuple[str, str], Obj]:
    """Objects keyed by (kind, name), without the documented differences."""
    out: dict[tuple[str, str], Obj] = {}
    for o in without_config_hash(copy.deepcopy(objs)):
        if o["kind"] == "Namespace":
            assert not chart, "the chart must not render the release namespace"
            continue
        labels = o["metadata"].get("labels", {})
        if chart and o["kind"] != "CustomResourceDefinition":  # crds/ is not templated
            assert set(labels) >= HELM_ONLY_LABELS, o["metadata"]["name"]
            for key in HELM_ONLY_LABELS:
                del labels[key]
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


def test_helm_lint_is_clean() -> None:
    res = run_helm("lint", "--strict", str(CHART), "--namespace", NS)
    assert res.rc == 0, res.out + res.err
    assert "0 chart(s) failed" in res.out


def assert_same_objects(chart: list[Obj], config: list[Obj]) -> None:
    """``chart`` (helm template) and ``config`` (kubectl kustomize) are the same objects but for
    the documented differences."""
    ours = comparable(chart, chart=True)
    theirs = comparable(config, chart=False)
    assert sorted(ours) == sorted(theirs)
    for name, kind in WORKLOADS.items():
        chart_ctr = ours[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
        config_ctr = theirs[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
        config_env = env(config_ctr)
        kept = []
        for item in chart_ctr["env"]:
            extra = CHART_ONLY_ENV[name].get(item["name"])
            if extra is not None and item["name"] not in config_env:
                assert item == {"name": item["name"], "value": extra}
                continue
            kept.append(item)
        # No env value refers to another ($(VAR)), so their order does not matter.
        assert "$(" not in yaml.safe_dump([kept, config_ctr["env"]])
        chart_ctr["env"] = sorted(kept, key=lambda e: str(e["name"]))
        config_ctr["env"] = sorted(config_ctr["env"], key=lambda e: str(e["name"]))
    for key in sorted(theirs):
        assert ours[key] == theirs[key], f"{key}: chart and config/ differ"


def test_default_values_render_config_default() -> None:
    assert_same_objects(template(), kustomize(CONFIG / "default"))


def test_host_managed_renders_config_default_with_the_host_managed_component(
    tmp_path: Path,
) -> None:
    """``resources.computeDomains.imex.mode=hostManaged`` (and its gate) is config/default with
    config/components/host-managed-imex."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
                "components": [
                    os.path.relpath(CONFIG / "components" / "host-managed-imex", tmp_path)
                ],
            }
        )
    )
    assert_same_objects(template(*HOST_MANAGED), kustomize(tmp_path))


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_resource_api_version_renders_config_default_with_its_component(
    tmp_path: Path, version: str
) -> None:
    """``resourceApiVersion=resource.k8s.io/<version>`` (Kubernetes 1.32/1.33) is config/default
    with config/components/resource-<version>: the DeviceClasses in that version, nothing else
    changed."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
                "components": [
                    os.path.relpath(CONFIG / "components" / f"resource-{version}", tmp_path)
                ],
            }
        )
    )
    chart = template(f"resourceApiVersion=resource.k8s.io/{version}")
    assert_same_objects(chart, kustomize(tmp_path))
    classes = [o for o in chart if o["kind"] == "DeviceClass"]
    assert len(classes) == 2
    assert {o["apiVersion"] for o in classes} == {f"resource.k8s.io/{version}"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ((), "resource.k8s.io/v1"),  # helm's default capabilities include v1
        (("--api-versions", "resource.k8s.io/v1beta2"), "resource.k8s.io/v1"),
    ],
)
def test_empty_resource_api_version_picks_the_newest_the_cluster_reports(
    extra: tuple[str, ...], expected: str
) -> None:
    args = ["template", RELEASE, str(CHART), "--namespace", NS, *extra]
    result = run_helm(*args)
    assert result.rc == 0, result.err
    classes = [o for o in yaml.safe_load_all(result.out) if o and o["kind"] == "DeviceClass"]
    assert {o["apiVersion"] for o in classes} == {expected}


def test_chart_kube_version_is_upstreams() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.32.0-0"
    ok = run_helm("template", RELEASE, str(CHART), "--namespace", NS, "--kube-version", "1.32.0")
    assert ok.rc == 0, ok.err
    old = run_helm("template", RELEASE, str(CHART), "--namespace", NS, "--kube-version", "1.31.9")
    assert old.rc != 0 and "kubeVersion" in old.err


def test_crds_are_installed_from_crds_folder_only() -> None:
    """Helm installs crds/ once and never upgrades or deletes it: ``helm uninstall`` keeps every
    ComputeDomain. The CRDs must not be templates (Helm would delete those)."""
    assert not any(o["kind"] == "CustomResourceDefinition" for o in template(crds=False))
    crds = [o for o in template() if o["kind"] == "CustomResourceDefinition"]
    assert {o["metadata"]["name"] for o in crds} == {
        "computedomains.resource.nvidia.com",
        "computedomaincliques.resource.nvidia.com",
    }
    assert not list((CHART / "templates").glob("*customresourcedefinition*"))


@pytest.mark.parametrize("override", [False, True])
def test_namespace_reaches_every_object_and_the_admission_policies(override: bool) -> None:
    ns = "gpu-system"
    objs = (
        template(f"namespaceOverride={ns}", namespace="release-ns")
        if override
        else template(namespace=ns)
    )
    text = yaml.safe_dump_all(objs)
    assert NS not in text and "release-ns" not in text
    cluster_scoped = {
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for o in objs:
        if o["kind"] in cluster_scoped:
            assert "namespace" not in o["metadata"], o["metadata"]["name"]
        else:
            assert o["metadata"]["namespace"] == ns, o["metadata"]["name"]
        for subject in o.get("subjects", []):
            assert subject["namespace"] == ns
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    users = {cond["expression"] for p in policies for cond in p["spec"].get("matchConditions", [])}
    assert users == {
        f'request.userInfo.username == "system:serviceaccount:{ns}:compute-domain-daemon"',
        f'request.userInfo.username == "system:serviceaccount:{ns}:compute-domain-kubelet-plugin"',
        f'request.userInfo.username == "system:serviceaccount:{ns}:compute-domain-controller"',
    }
    # The controller's DaemonSet policy reads the release's controller Deployment.
    ds_binding = find(
        objs, "ValidatingAdmissionPolicyBinding", "compute-domain-controller-daemonsets"
    )
    assert ds_binding["spec"]["paramRef"]["namespace"] == ns
    find(objs, "Deployment", ds_binding["spec"]["paramRef"]["name"])
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "compute-domain-daemon-device-claims")
    [expr] = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}


def test_default_namespace_is_refused_unless_allowed() -> None:
    err = refusal(namespace="default")
    assert "Running in the 'default' namespace is not recommended." in err
    assert "Set 'allowDefaultNamespace=true' to bypass this error." in err
    template("allowDefaultNamespace=true", namespace="default")


def test_driver_root_is_one_value() -> None:
    objs = template("nvidiaDriverRoot=/run/nvidia/driver")
    ds = find(objs, "DaemonSet", "compute-domain-kubelet-plugin")
    ctr = container(objs, "DaemonSet", "compute-domain-kubelet-plugin")
    [volume] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "driver-root"]
    assert volume["hostPath"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    assert env(ctr)["NVIDIA_DRIVER_ROOT"]["value"] == "/run/nvidia/driver"
    assert "/run/nvidia/driver" not in yaml.safe_dump(template())


# (--set pairs, exact text the failure must contain): upstream's messages for the IMEX config.
IMEX_MESSAGES = [
    (
        ("resources.computeDomains.imex.mode=hostManaged",),
        "resources.computeDomains.imex.mode=hostManaged requires "
        "featureGates.HostManagedIMEXDaemon=true",
    ),
    (
        (
            "resources.computeDomains.imex.mode=hostManaged",
            "featureGates.HostManagedIMEXDaemon=false",
        ),
        "resources.computeDomains.imex.mode=hostManaged requires "
        "featureGates.HostManagedIMEXDaemon=true",
    ),
    (
        ("resources.computeDomains.imex.mode=sideways",),
        'unknown resources.computeDomains.imex.mode "sideways": '
        'must be "driverManaged" or "hostManaged"',
    ),
    (
        ("resources.computeDomains.imex.isolation=channel",),
        "resources.computeDomains.imex.isolation=channel is not supported yet: per-workload IMEX "
        'channel allocation is not implemented. Use the default, "domain".',
    ),
    (
        ("resources.computeDomains.imex.isolation=node",),
        'unknown resources.computeDomains.imex.isolation "node": must be "domain" or "channel"',
    ),
]


@pytest.mark.parametrize(("sets", "message"), IMEX_MESSAGES, ids=lambda v: str(v)[:40])
def test_imex_config_fails_fast_with_upstreams_message(sets: tuple[str, ...], message: str) -> None:
    assert message in refusal(*sets)


def test_host_managed_mode_drops_the_daemon_objects_and_sets_the_env() -> None:
    driver_managed = keyed(template())
    assert set(driver_managed) >= DAEMON_OBJECTS
    sock = "/etc/nvidia-imex/other.sock"
    objs = template(*HOST_MANAGED, f"resources.computeDomains.imex.hostSocketPath={sock}")
    host_managed = keyed(objs)
    assert set(driver_managed) - set(host_managed) == DAEMON_OBJECTS
    assert set(host_managed) <= set(driver_managed)
    ctrl = env(container(objs, "Deployment", "compute-domain-controller"))
    plugin = env(container(objs, "DaemonSet", "compute-domain-kubelet-plugin"))
    for e in (ctrl, plugin):
        assert e["IMEX_MODE"]["value"] == "hostManaged"
        assert e["IMEX_ISOLATION"]["value"] == "domain"
    assert plugin["IMEX_HOST_SOCKET_PATH"]["value"] == sock
    assert "IMEX_HOST_SOCKET_PATH" not in ctrl
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["data"]["FEATURE_GATES"] == "HostManagedIMEXDaemon=true"


# (--set pairs, the key the refusal must name): values this driver cannot honour.
REFUSED = [
    (("resources.gpus.enabled=true",), "resources.gpus.enabled=true"),
    (("resources.computeDomains.enabled=false",), "resources.computeDomains.enabled=false"),
    (("webhook.enabled=true",), "webhook.enabled=true"),
    (("nvidiaCDIHookPath=/usr/bin/nvidia-cdi-hook",), "nvidiaCDIHookPath"),
    (("consumableShares=memory",), "consumableShares"),
    (("nameOverride=x",), "nameOverride"),
    (("fullnameOverride=x",), "fullnameOverride"),
    (("selectorLabelsOverride.a=b",), "selectorLabelsOverride"),
    (("serviceAccount.create=false",), "serviceAccount.create"),
    (("serviceAccount.name=x",), "serviceAccount.name"),
    (
        ("image.repository=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu",),
        "image.repository=registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu",
    ),
    (
        ("resourceApiVersion=resource.k8s.io/v1alpha3",),
        "resourceApiVersion=resource.k8s.io/v1alpha3",
    ),
    (("controller.leaderElection.enabled=false",), "controller.leaderElection.enabled=false"),
    (("controller.metrics.enabled=false",), "controller.metrics.enabled=false"),
    (("controller.metrics.httpEndpoint=localhost",), "controller.metrics.httpEndpoint=localhost"),
    (("controller.metrics.profilePath=/debug/pprof",), "controller.metrics.profilePath"),
    (("controller.networkPolicy.enabled=true",), "controller.networkPolicy.enabled=true"),
    (("kubeletPlugin.networkPolicy.enabled=true",), "kubeletPlugin.networkPolicy.enabled=true"),
    (
        ("kubeletPlugin.containers.computeDomains.healthcheckPort=-1",),
        "kubeletPlugin.containers.computeDomains.healthcheckPort",
    ),
    (("namespace=x",), "namespace=x"),
    (("nvidiaCtkPath=/usr/bin/nvidia-ctk",), "nvidiaCtkPath"),
    # Not upstream's keys at all: the schema names them.
    (("controller.replicaCount=3",), "replicaCount"),
    (("imex.mode=hostManaged",), "imex"),
    (("kubeletPlugin.containers.computeDomains.gpuCliqueLabel=true",), "gpuCliqueLabel"),
]


@pytest.mark.parametrize(("sets", "key"), REFUSED, ids=lambda v: str(v)[:50])
def test_unsupported_value_is_refused_naming_it(sets: tuple[str, ...], key: str) -> None:
    assert key in refusal(*sets)


def test_one_replica_without_leader_election_is_allowed() -> None:
    objs = template("controller.replicas=1", "controller.leaderElection.enabled=false")
    ctrl = env(container(objs, "Deployment", "compute-domain-controller"))
    assert ctrl["LEADER_ELECTION_ENABLED"]["value"] == "false"


def test_upstream_value_names_reach_the_objects(tmp_path: Path) -> None:
    values: Obj = {
        "nvidiaDriverRoot": "/run/nvidia/driver",
        "altProcDevices": "/var/lib/nvml-mock/imex/proc-devices",
        "featureGates": {"HostManagedIMEXDaemon": False, "IMEXDaemonsWithDNSNames": True},
        "logVerbosity": 6,
        "image": {"repository": "registry.example/cd/", "tag": "v9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "one"}, {"name": "two"}],
        "serviceAccount": {"annotations": {"example.com/a": "b"}},
        "controller": {
            "replicas": 3,
            "leaderElection": {"leaseDuration": "20s", "renewDeadline": "12s", "retryPeriod": "3s"},
            "metrics": {"httpEndpoint": "0.0.0.0:9090", "metricsPath": "/m"},
            "priorityClassName": "ctrl-prio",
            "podAnnotations": {"a": "1"},
            "nodeSelector": {"role": "ctrl"},
            "tolerations": [{"key": "t", "operator": "Exists"}],
            "affinity": None,  # null drops a default map ({} would keep it: Helm merges)
            "containers": {
                "computeDomain": {
                    "env": [{"name": "X", "value": "1"}],
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"memory": "1Gi"},
                    },
                }
            },
        },
        "kubeletPlugin": {
            "metrics": {"computeDomainHttpEndpoint": ":9191"},
            "priorityClassName": "plugin-prio",
            "podAnnotations": {"b": "2"},
            "nodeSelector": {"gpu": "yes"},
            "tolerations": [],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "nvidia.com/gpu.present",
                                        "operator": "In",
                                        "values": ["true"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "kubeletRegistrarDirectoryPath": "/k/registry",
            "kubeletPluginsDirectoryPath": "/k/plugins",
            "containers": {
                "computeDomains": {
                    "healthcheckPort": 5000,
                    "gpuCliqueLabelEnabled": True,
                    "env": [{"name": "EXTRA", "value": "2"}],
                }
            },
        },
    }
    objs = template(values=values, tmp=tmp_path)
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["data"] == {
        "FEATURE_GATES": "HostManagedIMEXDaemon=false,IMEXDaemonsWithDNSNames=true",
        "LOG_VERBOSITY": "6",
    }
    for o in objs:
        if o["kind"] == "ServiceAccount":
            assert o["metadata"]["annotations"] == {"example.com/a": "b"}

    deploy = find(objs, "Deployment", "compute-domain-controller")
    pod: Any = deploy["spec"]["template"]
    ctrl = pod["spec"]["containers"][0]
    e = env(ctrl)
    assert deploy["spec"]["replicas"] == 3
    assert ctrl["image"] == "registry.example/cd/compute-domain-controller:v9"
    assert ctrl["imagePullPolicy"] == "Always"
    assert e["IMAGE_NAME"]["value"] == "registry.example/cd/compute-domain-daemon:v9"
    assert e["CD_DAEMON_IMAGE_PULL_SECRET_NAMES"]["value"] == "one,two"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "one"}, {"name": "two"}]
    assert {
        k: e[k]["value"]
        for k in (
            "LEADER_ELECTION_LEASE_DURATION",
            "LEADER_ELECTION_RENEW_DEADLINE",
            "LEADER_ELECTION_RETRY_PERIOD",
        )
    } == {
        "LEADER_ELECTION_LEASE_DURATION": "20s",
        "LEADER_ELECTION_RENEW_DEADLINE": "12s",
        "LEADER_ELECTION_RETRY_PERIOD": "3s",
    }
    assert e["HTTP_ENDPOINT"]["value"] == "0.0.0.0:9090" and e["METRICS_PATH"]["value"] == "/m"
    assert ctrl["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
    assert e["X"]["value"] == "1"
    assert ctrl["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod["metadata"]["annotations"] == {"a": "1"}
    assert pod["spec"]["priorityClassName"] == "ctrl-prio"
    assert pod["spec"]["nodeSelector"] == {"role": "ctrl"}
    assert pod["spec"]["tolerations"] == [{"key": "t", "operator": "Exists"}]
    assert "affinity" not in pod["spec"]

    ds = find(objs, "DaemonSet", "compute-domain-kubelet-plugin")
    pod = ds["spec"]["template"]
    plug = pod["spec"]["containers"][0]
    e = env(plug)
    assert plug["image"] == "registry.example/cd/compute-domain-kubelet-plugin:v9"
    assert e["HTTP_ENDPOINT"]["value"] == ":9191" and e["HEALTHCHECK_PORT"]["value"] == "5000"
    assert {p["name"]: p["containerPort"] for p in plug["ports"]} == {
        "healthz": 5000,
        "metrics": 9191,
    }
    assert plug["livenessProbe"]["grpc"]["port"] == plug["readinessProbe"]["grpc"]["port"] == 5000
    assert e["GPU_CLIQUE_LABEL_ENABLED"]["value"] == "true" and e["EXTRA"]["value"] == "2"
    assert e["ALT_PROC_DEVICES_PATH"]["value"] == "/alt-proc-devices"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in plug["volumeMounts"]}
    assert volumes["alt-proc-devices"]["hostPath"] == {
        "path": "/var/lib/nvml-mock/imex/proc-devices",
        "type": "File",
    }
    assert mounts["alt-proc-devices"] == "/alt-proc-devices"
    assert e["KUBELET_REGISTRAR_DIRECTORY_PATH"]["value"] == "/k/registry"
    registry = volumes["plugins-registry"]["hostPath"]["path"]
    assert registry == mounts["plugins-registry"] == "/k/registry"
    # The env keeps upstream's meaning (the kubelet's plugins directory); only the driver's own
    # directory in it is mounted.
    assert e["KUBELET_PLUGINS_DIRECTORY_PATH"]["value"] == "/k/plugins"
    plugin_dir = volumes["plugins"]["hostPath"]["path"]
    assert plugin_dir == mounts["plugins"] == "/k/plugins/compute-domain.nvidia.com"
    assert not any(
        v["hostPath"]["path"].rstrip("/") == "/k/plugins"
        for v in pod["spec"]["volumes"]
        if "hostPath" in v
    )
    assert volumes["driver-root"]["hostPath"]["path"] == "/run/nvidia/driver"
    assert pod["metadata"]["annotations"] == {"b": "2"}
    assert pod["spec"]["priorityClassName"] == "plugin-prio"
    # Maps merge with the chart's default (documented); lists replace it.
    assert pod["spec"]["nodeSelector"] == {"gpu": "yes", "nvidia.com/gpu.present": "true"}
    assert "tolerations" not in pod["spec"]
    assert pod["spec"]["affinity"] == values["kubeletPlugin"]["affinity"]


def test_plugin_metrics_path_reaches_the_plugin() -> None:
    plug = env(
        container(
            template("kubeletPlugin.metrics.metricsPath=/m"),
            "DaemonSet",
            "compute-domain-kubelet-plugin",
        )
    )
    assert plug["METRICS_PATH"]["value"] == "/m"
    default = env(container(template(), "DaemonSet", "compute-domain-kubelet-plugin"))
    assert "METRICS_PATH" not in default  # the plugin's own default, /metrics


def test_plugin_metrics_off_drops_endpoint_and_port() -> None:
    plug = container(
        template("kubeletPlugin.metrics.enabled=false"),
        "DaemonSet",
        "compute-domain-kubelet-plugin",
    )
    assert "HTTP_ENDPOINT" not in env(plug)
    assert [p["name"] for p in plug["ports"]] == ["healthz"]


def upstream_operator_values() -> Obj:
    """A values file an operator of upstream's chart (v0.5) runs the ComputeDomain half with
    (``ci/upstream-operator-values.yaml``; the real-node lane installs with it too), fresh on
    every call."""
    loaded: Obj = yaml.safe_load(UPSTREAM_VALUES.read_text())
    return loaded


def test_an_upstream_operators_values_file_renders(tmp_path: Path) -> None:
    values = upstream_operator_values()
    objs = template(values=values, tmp=tmp_path)
    plug = env(container(objs, "DaemonSet", "compute-domain-kubelet-plugin"))
    ctrl = env(container(objs, "Deployment", "compute-domain-controller"))
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["data"]["LOG_VERBOSITY"] == "4"
    assert ctrl["LEADER_ELECTION_ENABLED"]["value"] == "false"
    assert ctrl["LEADER_ELECTION_LEASE_DURATION"]["value"] == "15s"
    assert plug["HTTP_ENDPOINT"]["value"] == ":8081"
    ds = find(objs, "DaemonSet", "compute-domain-kubelet-plugin")
    # Helm merges maps: upstream's rollingUpdate keeps this chart's maxSurge 0.
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "100%",
        "maxSurge": 0,
    }
    # Upstream's default of resources.gpus.enabled (true) is refused here, naming it.
    values["resources"]["gpus"]["enabled"] = True
    assert "resources.gpus.enabled=true" in refusal(values=values, tmp=tmp_path)


def test_schema_refuses_unknown_keys_at_every_level() -> None:
    schema = (CHART / "values.schema.json").read_text()
    assert schema.count('"additionalProperties": false') >= 10
    for path in (
        "bogus",
        "controller.bogus",
        "kubeletPlugin.metrics.bogus",
        "resources.computeDomains.imex.bogus",
    ):
        err = refusal(f"{path}=1")
        assert "bogus" in err and "additional" in err.lower(), err


def _free_form(prefix: str) -> bool:
    return prefix != "resources." and prefix.endswith(FREE_FORM)


def _leaf_paths(value: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the chart's own keys in ``value`` (a Kubernetes object value is a leaf)."""
    if isinstance(value, dict) and value and not _free_form(prefix):
        return [p for k, v in value.items() for p in _leaf_paths(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


# Values whose content is a Kubernetes object (not further keys of the chart).
FREE_FORM = (
    "affinity.",
    "podSecurityContext.",
    "securityContext.",
    "resources.",
    "updateStrategy.",
    "seccompProfile.",
    "tolerations.",
    "nodeSelector.",
)


def test_operator_docs_map_every_value() -> None:
    """docs/operators.md "Install with Helm" has a row for every value of values.yaml."""
    doc = (REPO / "docs" / "operators.md").read_text()
    start = doc.index("## Install with Helm")
    section = doc[start : doc.index("\n## ", start + 1)]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [
        p
        for p in _leaf_paths(values)
        if not re.search(rf"`{re.escape(p)}[`.{{]", section)
        and not re.search(rf"`{re.escape(p.rsplit('.', 1)[0])}\.\*`", section)
    ]
    assert not missing, f"values not in docs/operators.md 'Install with Helm': {missing}"


CONTROLLER_SOURCES = (REPO / "pkg", REPO / "cmd" / "compute-domain-controller")
PLUGIN_ENTRY = REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"
# Env the chart sets that no Python code reads, on purpose (as test/unit/config).
ENV_NOT_READ_BY_CODE = {"POD_UID"}


def resolved_env(objs: list[Obj], kind: str, name: str) -> dict[str, str]:
    """A workload's env as its process would see it: ConfigMap keys and downward-API fields
    resolved (fields to placeholders)."""
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    out = {}
    for e in container(objs, kind, name)["env"]:
        ref = e.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            assert ref["configMapKeyRef"]["name"] == cm["metadata"]["name"]
            out[e["name"]] = str(cm["data"][ref["configMapKeyRef"]["key"]])
        elif "fieldRef" in ref:
            out[e["name"]] = f"field-{ref['fieldRef']['fieldPath']}"
        else:
            out[e["name"]] = str(e["value"])
    return out


def chart_renders(tmp: Path) -> list[list[Obj]]:
    """Default values, host-managed mode, and an upstream operator's values file."""
    return [
        template(),
        template(*HOST_MANAGED),
        template(values=upstream_operator_values(), tmp=tmp),
    ]


def test_every_chart_env_var_is_read_by_the_code(tmp_path: Path) -> None:
    """A renamed env var in the code must not leave the chart silently setting a dead one."""
    sources = {
        "compute-domain-controller": "\n".join(
            p.read_text() for d in CONTROLLER_SOURCES for p in d.rglob("*.py")
        ),
        "compute-domain-kubelet-plugin": "\n".join(
            p.read_text() for d in (REPO / "pkg", PLUGIN_ENTRY.parent) for p in d.rglob("*.py")
        ),
    }
    for objs in chart_renders(tmp_path):
        for name, kind in WORKLOADS.items():
            for var in resolved_env(objs, kind, name):
                if var not in ENV_NOT_READ_BY_CODE:
                    assert f'"{var}"' in sources[name], (
                        f"{name}: chart sets {var}, nothing reads it"
                    )


def test_controller_accepts_the_charts_env(tmp_path: Path) -> None:
    """The controller's own option parser (flags, feature gates, IMEX mode) takes the env."""
    for objs in chart_renders(tmp_path):
        env_ = resolved_env(objs, "Deployment", "compute-domain-controller")
        options = parse_options(["-v", env_["LOG_VERBOSITY"]], env_)
        assert options is not None


def test_kubelet_plugin_accepts_the_charts_env(tmp_path: Path) -> None:
    """The plugin's argument parser takes the env, and its IMEX config validates."""
    for objs in chart_renders(tmp_path):
        env_ = resolved_env(objs, "DaemonSet", "compute-domain-kubelet-plugin")
        args = parse_plugin_args(["-v", env_["LOG_VERBOSITY"]], env_)
        assert args.healthcheck_port == int(env_["HEALTHCHECK_PORT"])
        assert args.nvidia_driver_root == env_["NVIDIA_DRIVER_ROOT"]
        gates = FeatureGates.parse(env_["FEATURE_GATES"]).validate()
        ImexModeConfig(mode=args.imex_mode, isolation=args.imex_isolation).validate(
            gate_enabled=gates.enabled("HostManagedIMEXDaemon")
        )
