"""Flags and env of compute-domain-daemon (the upstream env contract plus our additions)."""

from __future__ import annotations

import pytest

from pkg.daemon.options import CDI_MISSING, OptionsError, parse
from pkg.featuregates import IMEX_DAEMONS_WITH_DNS_NAMES

ENV = {
    "CLIQUE_ID": "cluster.1",
    "COMPUTE_DOMAIN_UUID": "uid-1",
    "COMPUTE_DOMAIN_NAME": "cd",
    "COMPUTE_DOMAIN_NAMESPACE": "team",
    "NODE_NAME": "node-1",
    "POD_IP": "10.0.0.1",
    "POD_UID": "pod-uid",
    "POD_NAME": "daemon-abc",
    "POD_NAMESPACE": "nvidia-dra-driver",
}


def test_env_contract_and_defaults() -> None:
    opts = parse(["run"], ENV)
    opts.validate_run()
    assert (opts.clique_id, opts.domain_uid, opts.node_name, opts.pod_ip) == (
        "cluster.1",
        "uid-1",
        "node-1",
        "10.0.0.1",
    )
    assert opts.max_nodes == 18 and opts.config_path == "/imexd/imexd.cfg"
    assert opts.hosts_file == "/etc/hosts" and opts.metrics_address == ""
    # Found through PATH, where CDI put them (no simulator back door such as IMEX_BIN_DIR).
    assert opts.imex_argv == ("nvidia-imex",) and opts.imex_ctl_argv == ("nvidia-imex-ctl",)
    assert opts.termination_log == "/dev/termination-log"
    assert parse(["run"], {**ENV, "IMEX_BIN_DIR": "/sim/bin"}).imex_argv == ("nvidia-imex",)
    assert opts.gates.enabled(IMEX_DAEMONS_WITH_DNS_NAMES)
    assert (opts.server_port, opts.cmd_port) == (50000, 50005)


def test_overrides_from_env_and_flags() -> None:
    env = {
        **ENV,
        "IMEX_CONFIG_DIR": "/tmp/n1",
        "IMEX_BINARY": "/opt/imex/nvidia-imex",
        "MAX_NODES_PER_IMEX_DOMAIN": "4",
        "IMEX_HOSTS_FILE": "/tmp/n1/hosts",
        "TERMINATION_LOG": "/tmp/n1/termination-log",
        "FEATURE_GATES": "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false",
    }
    opts = parse(
        [
            "-v",
            "5",
            "--imex-ctl-binary",
            "python3 -m pkg.imex.sim.ctl",
            "--imex-server-port",
            "41000",
            "run",
        ],
        env,
    )
    assert opts.verbosity == 5 and opts.max_nodes == 4
    assert opts.nodes_config_path == "/tmp/n1/nodes.cfg"
    assert opts.imex_argv == ("/opt/imex/nvidia-imex",)
    assert opts.termination_log == "/tmp/n1/termination-log"
    assert opts.imex_ctl_argv == ("python3", "-m", "pkg.imex.sim.ctl")
    assert opts.server_port == 41000 and not opts.gates.enabled(IMEX_DAEMONS_WITH_DNS_NAMES)


def test_missing_cdi_edits() -> None:
    env = {k: v for k, v in ENV.items() if k != "COMPUTE_DOMAIN_UUID"}
    with pytest.raises(OptionsError) as err:
        parse(["run"], env).validate_run()
    assert str(err.value) == CDI_MISSING
    parse(["check"], env)  # check does not need them


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FEATURE_GATES": "IMEXDaemonsWithDNSNames=false"}, "requires IMEXDaemonsWithDNSNames"),
        ({"FEATURE_GATES": "Bogus=true"}, "unrecognized feature gate: Bogus"),
        ({"MAX_NODES_PER_IMEX_DOMAIN": "x"}, "not an integer"),
        ({"MAX_NODES_PER_IMEX_DOMAIN": "0"}, "outside"),
        ({"POD_IP": ""}, "POD_IP"),
    ],
    ids=["gate-dependency", "unknown-gate", "max-nodes-nan", "max-nodes-zero", "no-pod-ip"],
)
def test_invalid(env: dict[str, str], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        parse(["run"], {**ENV, **env}).validate_run()


def test_non_nvlink_node_needs_no_pod_ip() -> None:
    parse(["run"], {**ENV, "CLIQUE_ID": "", "POD_IP": ""}).validate_run()


def test_go_driver_gates_are_accepted() -> None:
    """The controller forwards gates it was given for the Go driver's GPU plugin, too."""
    opts = parse(["run"], {**ENV, "FEATURE_GATES": "MPSSupport=true,ContextualLogging=false"})
    opts.validate_run()
    assert opts.gates.unimplemented() == ["ContextualLogging", "MPSSupport"]


def test_shared_flag_rules() -> None:
    """The daemon's table is on the shared mechanism: -v spellings, Go booleans, labels."""
    for argv in (["-v", "5"], ["--v=5"], ["--verbosity", "5"], ["-v=5"], ["-verbosity=5"]):
        assert parse([*argv, "run"], ENV).verbosity == 5
    assert parse(["run"], {**ENV, "LOG_VERBOSITY": "3"}).verbosity == 3
    # V is upstream's variable of -v; it wins over LOG_VERBOSITY, a flag over both.
    assert parse(["run"], {**ENV, "V": "4", "LOG_VERBOSITY": "3"}).verbosity == 4
    assert parse(["run"], {**ENV, "V": "4"}).verbosity == 4
    assert parse(["-v=6", "run"], {**ENV, "V": "4", "LOG_VERBOSITY": "3"}).verbosity == 6
    assert parse(["run"], ENV).verbosity == 2
    assert parse(["run"], {**ENV, "CLIQUE_JOIN_BY_CONTROLLER": "T"}).join_by_controller
    with pytest.raises(OptionsError, match=r'^CLIQUE_JOIN_BY_CONTROLLER: invalid boolean "yes"'):
        parse(["run"], {**ENV, "CLIQUE_JOIN_BY_CONTROLLER": "yes"})
    with pytest.raises(OptionsError, match=r"^--imex-cmd-port \(or IMEX_CMD_PORT\): "):
        parse(["--imex-cmd-port=x", "run"], ENV)
    assert parse(["-config-dir=/c", "run"], {**ENV, "IMEX_CONFIG_DIR": ""}).config_dir == "/c"
    assert parse(["run"], {**ENV, "IMEX_CONFIG_DIR": ""}).config_dir == "/imexd"


def test_start_up_dump_has_every_row() -> None:
    dump = dict(parse(["run"], ENV).flag_values)
    assert dump["node_name"] == "node-1" and dump["v"] == 2
    assert dump["max_nodes_per_imex_domain"] == 18 and dump["feature_gates"] == ""


def test_repeated_feature_gates_are_laid_over_the_env_as_upstreams() -> None:
    env = {**ENV, "FEATURE_GATES": "MPSSupport=true,DynamicMIG=true"}
    argv = ["--feature-gates=MPSSupport=false", "--feature-gates=TimeSlicingSettings=true"]
    opts = parse([*argv, "run"], env)
    assert opts.gates.overrides == {
        "MPSSupport": False,
        "DynamicMIG": True,
        "TimeSlicingSettings": True,
    }
