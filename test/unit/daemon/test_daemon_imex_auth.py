"""IMEX's own authentication/encryption reaches imexd.cfg.

The daemon reads the settings from its environment (or flags) under imexd.cfg's own key names,
``IMEX_ENABLE_AUTH_ENCRYPTION`` and friends, into :class:`pkg.imex.config.AuthConfig` and writes
them into the IMEX config; unset, the file says what upstream's says (authentication off). An
operator sets them on every daemon through the controller's ``--cd-daemon-extra-env``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_daemon_daemon import (  # type: ignore[import-not-found, unused-ignore]
    make,
    options,
)

from pkg.daemon.options import OptionsError, parse
from pkg.imex.config import AuthConfig, read_config
from pkg.reconcilers.config import parse_extra_env
from pkg.testing.fakeapiserver import FakeApiServer

TLS_ENV = {
    "IMEX_ENABLE_AUTH_ENCRYPTION": "1",
    "IMEX_AUTH_ENCRYPTION_MODE": "SSL_TLS",
    "IMEX_AUTH_SOURCE": "FILE",
    "IMEX_SERVER_KEY": "/etc/imex-tls/tls.key",
    "IMEX_SERVER_CERT": "/etc/imex-tls/tls.crt",
    "IMEX_SERVER_CERT_AUTH": "/etc/imex-tls/ca.crt",
    "IMEX_CLIENT_KEY": "/etc/imex-tls/tls.key",
    "IMEX_CLIENT_CERT": "/etc/imex-tls/tls.crt",
    "IMEX_CLIENT_CERT_AUTH": "/etc/imex-tls/ca.crt",
    "IMEX_SECURITY_TARGET_OVERRIDE": "imex.compute-domain.nvidia.com",
}


def _written(daemon_tmp: Path) -> dict[str, str]:
    return read_config(daemon_tmp / "imexd" / "imexd.cfg")


def test_off_by_default_as_upstream(api: FakeApiServer, tmp_path: Path) -> None:
    opts = options(tmp_path)
    assert opts.auth == AuthConfig()
    daemon, *_ = make(api, opts)
    daemon._write_imex_config()
    cfg = _written(tmp_path)
    assert cfg["IMEX_ENABLE_AUTH_ENCRYPTION"] == "0"
    assert cfg["IMEX_AUTH_ENCRYPTION_MODE"] == "SSL_TLS"
    for key in (
        "IMEX_AUTH_SOURCE",
        "IMEX_SERVER_KEY",
        "IMEX_CLIENT_CERT_AUTH",
        "IMEX_SECURITY_TARGET_OVERRIDE",
    ):
        assert cfg[key] == "", key


def test_env_turns_tls_on_in_imexd_cfg(api: FakeApiServer, tmp_path: Path) -> None:
    daemon, *_ = make(api, options(tmp_path, **TLS_ENV))
    daemon._write_imex_config()
    cfg = _written(tmp_path)
    for key, value in TLS_ENV.items():
        assert cfg[key] == value, key
    # The IMEX ports and bind address are untouched by it.
    assert cfg["BIND_INTERFACE_IP"] == "10.0.0.1" and cfg["IMEX_CMD_ENABLED"] == "1"


def test_flags_override_the_env() -> None:
    opts = parse(
        [
            "run",
            "--imex-enable-auth-encryption=false",
            "--imex-auth-source=ENV",
            "--imex-server-key=IMEX_KEY_PEM",
        ],
        TLS_ENV,
    )
    assert opts.auth.enabled is False
    assert opts.auth.source == "ENV" and opts.auth.server_key == "IMEX_KEY_PEM"
    assert opts.auth.client_cert == "/etc/imex-tls/tls.crt"


@pytest.mark.parametrize(
    "env", ["IMEX_SERVER_CERT", "IMEX_AUTH_SOURCE", "IMEX_AUTH_ENCRYPTION_MODE"]
)
def test_a_value_that_would_break_the_file_is_refused_naming_it(env: str) -> None:
    with pytest.raises(OptionsError, match=env):
        parse(["run"], {**TLS_ENV, env: "x\nIMEX_ENABLE_AUTH_ENCRYPTION=0"})
    with pytest.raises(OptionsError, match=env):
        parse(["run"], {**TLS_ENV, env: "x#y"})


def test_the_controller_may_pass_them_to_every_daemon() -> None:
    """--cd-daemon-extra-env accepts them (they are no controller-owned daemon env)."""
    text = ",".join(f"{k}={v}" for k, v in TLS_ENV.items())
    assert dict(parse_extra_env(text)) == TLS_ENV
