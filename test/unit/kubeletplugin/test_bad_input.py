"""Bad input, counted: generated opaque configs, claims, checkpoint files and gRPC requests.

Each suite feeds hypothesis-generated input to the kubelet plugin's real code and holds every
case to the same bar: it is accepted, or it ends in an error where the user looks (an
`OpaqueConfigError` / per-claim error text naming the field, a corrupt checkpoint kept aside and
reported); never an unexpected exception, never a crash of the gRPC server, nothing lost or
left behind on the node. Outcomes are counted (`badinput.Tally`) for docs/reliability.md
(``make badinput``); the seed is fixed (`badinput.SEED`), so the counts are reproducible.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from badinput import SEED, Tally, examples
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from testsupport.kp_harness import (
    DRIVER_NS,
    NODE,
    running_plugin,
    seed_claim,
    seed_domain,
    short_tmpdir,
)

from pkg.api import constants as c
from pkg.api.opaque import OpaqueConfigError, decode_opaque_config
from pkg.draplugin.errors import PermanentError
from pkg.kube import resources as res
from pkg.kubeletplugin.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    DeviceGroup,
    PreparedDevice,
    canonical_status,
)
from pkg.kubeletplugin.checkpointformat import decode_checkpoint, encode_checkpoint
from pkg.kubeletplugin.claims import config_groups, status_targets
from pkg.testing.fakeapiserver import FakeApiServer

FIXTURES = Path(__file__).parent / "testdata" / "upstream_checkpoint"
BOOT_ID = "boot-1"


def suite_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- generators ---------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELD_NAMES = ["apiVersion", "kind", "domainID", "allocationMode"]
domain_ids = st.sampled_from(["cd-a", "", "CD-A", " cd-a"]) | st.uuids().map(str)


@st.composite
def opaque_parameters(draw: st.DrawFn) -> Any:
    """A valid channel/daemon config with a few mutations, or any JSON value."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    kind = draw(st.sampled_from([c.CHANNEL_CONFIG_KIND, c.DAEMON_CONFIG_KIND]))
    params: dict[str, Any] = {
        "apiVersion": c.API_VERSION,
        "kind": kind,
        "domainID": draw(domain_ids),
    }
    if kind == c.CHANNEL_CONFIG_KIND and draw(st.booleans()):
        params["allocationMode"] = draw(st.sampled_from(["Single", "All", "all", "", "Many"]))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        op = draw(st.sampled_from(["drop", "wrong-type", "unknown", "case", "value"]))
        name = draw(st.sampled_from(FIELD_NAMES))
        if op == "drop":
            params.pop(name, None)
        elif op == "wrong-type":
            params[name] = draw(json_values.filter(lambda v: not isinstance(v, str)))
        elif op == "unknown":
            params[draw(st.sampled_from(["domainId", "numNodes", "extra", "", "\u00e9"]))] = draw(
                json_values
            )
        elif op == "case" and name in params:
            params[name.lower()] = params.pop(name)
        else:
            params[name] = draw(st.text(max_size=20))
    return params


FIELD_IN_ERROR = re.compile(r'(?:unknown )?field "([^"]*)"')


def opaque_error_field(message: str) -> str:
    """The field an `OpaqueConfigError` names; fails the test if it names none."""
    if message.startswith("opaque parameters must be a JSON object"):
        return "(not an object)"
    found = FIELD_IN_ERROR.search(message)
    assert found, f"error does not name a field: {message!r}"
    return found.group(1)


CLAIM_ERRORS = [
    (r"^config\[\d+\]: invalid config source: ", "invalid config source"),
    (r"^config\[\d+\]: only opaque parameters are supported", "config without opaque"),
    (r'^config\[\d+\] \(opaque parameters\): .*(field "|JSON object)', "opaque field"),
    (r"^expected exactly one device of driver ", "several devices of ours"),
    (r"^requested device is not allocatable: \S+ \(driver ", "device not published"),
    (r'^no ComputeDomain(Channel|Daemon)Config for request "', "no config for the request"),
    (r"^cannot apply ComputeDomain\w+Config to request: ", "config of the wrong kind"),
]


def claim_error_kind(message: str) -> str:
    """What a claim-level `PermanentError` is about; fails the test on an unexpected message."""
    for pattern, kind in CLAIM_ERRORS:
        if re.search(pattern, message):
            return kind
    pytest.fail(f"unexpected claim error: {message!r}")


REQUESTS = ["channel", "daemon", "req", "req/sub", ""]


def well_formed_status(kind: str, domain: str) -> dict[str, Any]:
    """The status of a claim the controller's templates would produce, allocated here."""
    params = {
        "apiVersion": c.API_VERSION,
        "domainID": domain,
        "kind": c.CHANNEL_CONFIG_KIND if kind == "channel" else c.DAEMON_CONFIG_KIND,
    }
    result = {"request": kind, "driver": c.DRIVER_NAME, "pool": NODE, "device": f"{kind}-0"}
    config = {
        "source": "FromClaim",
        "requests": [kind],
        "opaque": {"driver": c.DRIVER_NAME, "parameters": params},
    }
    return {"allocation": {"devices": {"results": [result], "config": [config]}}}


@st.composite
def claim_statuses(draw: st.DrawFn, domains: list[str]) -> dict[str, Any]:
    """A ResourceClaim status as the API server would store it: a third well-formed (for one
    of ``domains`` or a random domain), the rest with arbitrary results and configs."""
    if draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["channel", "daemon"]))
        domain = draw(st.sampled_from(domains) if domains else st.uuids().map(str))
        return well_formed_status(kind, domain)
    results = [
        {
            "request": draw(st.sampled_from(REQUESTS)),
            "driver": draw(st.sampled_from([c.DRIVER_NAME, c.DRIVER_NAME, "gpu.nvidia.com"])),
            "pool": NODE,
            "device": draw(
                st.sampled_from(
                    ["channel-0", "channel-0", "daemon-0", "daemon-0", "gpu-0", "daemon"]
                )
            ),
            **({"adminAccess": True} if draw(st.integers(0, 7)) == 0 else {}),
        }
        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2])))
    ]
    configs = []
    for _ in range(draw(st.integers(0, 3))):
        params = draw(opaque_parameters())
        if isinstance(params, dict) and "domainID" in params and domains and draw(st.booleans()):
            params["domainID"] = draw(st.sampled_from(domains))
        config: dict[str, Any] = {
            "source": draw(st.sampled_from(["FromClaim"] * 5 + ["FromClass"] * 3 + ["FromUser"])),
            "requests": draw(
                st.sampled_from([[], []]) | st.lists(st.sampled_from(REQUESTS), max_size=2)
            ),
        }
        if draw(st.integers(0, 9)):
            config["opaque"] = {
                "driver": draw(st.sampled_from([c.DRIVER_NAME, c.DRIVER_NAME, "other.example"])),
                "parameters": params,
            }
        configs.append(config)
    if draw(st.integers(0, 9)) == 0:
        return {}
    return {"allocation": {"devices": {"results": results, "config": configs}}}


# -- opaque configs -----------------------------------------------------------------------------


def test_generated_opaque_configs_are_accepted_or_name_the_field() -> None:
    tally = Tally(
        "opaque configs",
        what="ComputeDomainChannel/DaemonConfig parameters: valid ones mutated (dropped, "
        "mistyped, unknown, mis-cased fields; odd values) and arbitrary JSON",
        where="per-claim error text naming the field",
    )

    @seed(SEED)
    @suite_settings(examples(300))
    @given(params=opaque_parameters())
    def case(params: Any) -> None:
        tally.case()
        try:
            config = decode_opaque_config(params)
        except OpaqueConfigError as err:
            field = opaque_error_field(str(err))
            unknown = str(err).startswith("strict decoding error: unknown field")
            tally.count("rejected: unknown field" if unknown else f"rejected: {field}")
        else:
            assert config.domain_id
            tally.count("accepted")
        # Stored state is decoded leniently: never raises anything but OpaqueConfigError.
        try:
            decode_opaque_config(params, strict=False)
        except OpaqueConfigError as err:
            opaque_error_field(str(err))

    case()
    assert tally.outcomes["accepted"] > 0 and len(tally.outcomes) > 4
    tally.save()


def test_generated_claims_resolve_or_fail_permanently_naming_what() -> None:
    tally = Tally(
        "claim configs",
        what="ResourceClaim statuses: 0-2 results (our and other drivers' devices, "
        "adminAccess), 0-3 configs (sources, requests, drivers, generated parameters)",
        where="per-claim error text (permanent) naming the config, field, request or device",
    )

    @seed(SEED)
    @suite_settings(examples(300))
    @given(status=claim_statuses(domains=[]))
    def case(status: dict[str, Any]) -> None:
        tally.case()
        claim = {"status": status}
        try:
            groups = config_groups(claim)
        except PermanentError as err:
            tally.count(f"permanent error: {claim_error_kind(str(err))}")
        else:
            tally.count("accepted" if groups else "not ours (nothing to prepare)")
        # The lenient readers of stored state never raise.
        status_targets(status)
        try:
            canonical_status(status)
        except ValueError:
            pytest.fail("a status the API server stores must be recordable")

    case()
    assert tally.outcomes["accepted"] > 0
    tally.save()


# -- checkpoint files ---------------------------------------------------------------------------


@st.composite
def checkpoint_entries(draw: st.DrawFn) -> dict[str, ClaimEntry]:
    entries = {}
    for _ in range(draw(st.integers(0, 3))):
        uid = str(draw(st.uuids()))
        state = draw(st.sampled_from(list(ClaimState)))
        kind = draw(st.sampled_from(["channel", "daemon"]))
        domain = str(draw(st.uuids()))
        status = canonical_status(draw(claim_statuses(domains=[domain])))
        groups: tuple[DeviceGroup, ...] = ()
        if state == ClaimState.PREPARE_COMPLETED:
            device = PreparedDevice(
                (kind,), NODE, f"{kind}-0", (f"k8s.compute-domain.nvidia.com/claim={uid}-{kind}-0",)
            )
            groups = (DeviceGroup(kind, domain, (device,)),)
        entries[uid] = ClaimEntry(
            uid=uid,
            state=state,
            status=status,
            groups=groups,
            namespace=draw(st.sampled_from(["", "team"])),
            name=draw(st.sampled_from(["", "claim", "w<0>&\u2028"])),
            aborted_at="2026-05-01T12:30:00Z" if state == ClaimState.PREPARE_ABORTED else None,
        )
    return entries


def _foreign(good: bytes) -> dict[str, bytes]:
    doc = json.loads(good)
    return {
        "empty": b"",
        "whitespace": b" \n",
        "null": b"null",
        "array": b"[]",
        "yaml": yaml.safe_dump(doc).encode(),
        "utf-16": good.decode().encode("utf-16"),
        "gzip": gzip.compress(good),
        "base64": base64.b64encode(good),
        "kubelet cpu_manager_state": b'{"policyName":"none","defaultCpuSet":"",'
        b'"checksum":1353318690}',
        "checksum as string": json.dumps({**doc, "checksum": str(doc["checksum"])}).encode(),
        "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
        "deep raw parameters": good.replace(b'"parameters":{', b'"parameters":' + b"[" * 5000, 1),
        "NaN checksum": b'{"checksum":NaN}',
        "year 1 with offset": good.replace(
            b'"allocationTimestamp":"2026-05-01T12:30:00Z"',
            b'"allocationTimestamp":"0001-01-01T00:00:00+01:00"',
        ),
        "pretty-printed": json.dumps(doc, indent=2).encode(),
    }


@st.composite
def checkpoint_files(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """(mutation, original good bytes, mutated bytes)."""
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(p.name for p in FIXTURES.glob("*.json"))))
        good = (FIXTURES / name).read_bytes()
    else:
        good = encode_checkpoint(draw(checkpoint_entries()), boot_id=BOOT_ID)
    mutation = draw(st.sampled_from(["intact", "truncated", "bit flips", "random JSON", "foreign"]))
    data = good
    if mutation == "truncated":
        data = good[: draw(st.integers(0, len(good) - 1))]
    elif mutation == "bit flips":
        flipped = bytearray(good)
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(good) - 1))
            flipped[pos] ^= 1 << draw(st.integers(0, 7))
        data = bytes(flipped)
    elif mutation == "random JSON":
        data = json.dumps(draw(json_values)).encode()
    elif mutation == "foreign":
        foreign = _foreign(good)
        kind = draw(st.sampled_from(sorted(foreign)))
        data, mutation = foreign[kind], f"foreign ({kind})"
    return mutation, good, data


def _expected(data: bytes) -> tuple[dict[str, ClaimEntry], bool]:
    """Entries a correct open keeps from ``data`` and whether the file is corrupt."""
    try:
        decoded = decode_checkpoint(data)
    except ValueError:
        return {}, True
    entries = dict(decoded.entries)
    if decoded.boot_id and decoded.boot_id != BOOT_ID:
        entries = {}
    return entries, bool(decoded.problems)


def test_generated_checkpoint_files_are_kept_aside_and_reported(tmp_path: Path) -> None:
    tally = Tally(
        "checkpoint files",
        what="checkpoint.json: ours and the Go driver's (fixtures), intact, truncated, 1-3 bit "
        "flips, random JSON, foreign formats (YAML, UTF-16, gzip, another kubelet checkpoint, "
        "deep nesting, ...)",
        where="plugin log (ERROR), corruption metric, `checkpoint` health NOT_SERVING; the file "
        "kept as checkpoint.json.corrupt-<ts>",
    )
    counter = iter(range(10**9))

    @seed(SEED)
    @suite_settings(examples(120))
    @given(file=checkpoint_files())
    def case(file: tuple[str, bytes, bytes]) -> None:
        tally.case()
        mutation, good, data = file
        directory = tmp_path / str(next(counter))
        directory.mkdir()
        (directory / "checkpoint.json").write_bytes(data)
        store = CheckpointStore(directory=directory, boot_id=BOOT_ID, now=lambda: 1_700_000_000.0)
        report = store.open()  # must not raise, whatever the file holds
        expected, corrupt = _expected(data)
        assert report.corrupt == corrupt, report
        # What verified is kept, nothing else is invented.
        assert store.entries() == expected
        # The new file verifies, also for the Go driver, and a restart finds it intact.
        assert decode_checkpoint(store.path.read_bytes()).problems == ()
        again = CheckpointStore(directory=directory, boot_id=BOOT_ID)
        assert not again.open().corrupt and again.entries() == expected
        if corrupt:
            # Nothing destroyed: the bad bytes are kept aside, and the report says where.
            assert report.moved_to is not None and report.moved_to.read_bytes() == data
            assert report.problem
            kept = "entries recovered" if report.recovered else "nothing verifiable"
            tally.count(f"{mutation.split(' (')[0]}: corrupt, kept aside, {kept}")
        else:
            assert sorted(p.name for p in directory.iterdir()) == ["checkpoint.json"]
            if mutation in ("truncated", "bit flips"):
                # Accepted damage changed nothing that matters (e.g. the case of a key).
                assert expected == _expected(good)[0]
            tally.count(f"{mutation.split(' (')[0]}: accepted")
        # A file that changes on disk after open and does not verify never replaces memory.
        store.path.write_bytes(b"\x00" + data)
        assert store.entries() == expected

    case()
    tally.save()


# -- gRPC requests ------------------------------------------------------------------------------

printable = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@st.composite
def grpc_claims(draw: st.DrawFn, api: FakeApiServer, domains: list[str]) -> list[dict[str, Any]]:
    """Claim references for one request: seeded claims (exact or with a wrong field) and made-up
    ones; duplicates allowed."""
    refs: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["seeded", "seeded", "seeded", "wrong uid", "made up", "dup"]))
        if how == "dup" and refs:
            refs.append(draw(st.sampled_from(refs)))
            continue
        if how == "made up":
            refs.append(
                {
                    "namespace": draw(printable),
                    "name": draw(printable),
                    "uid": draw(printable | st.text(min_size=300, max_size=300)),
                }
            )
            continue
        status = draw(claim_statuses(domains=domains))
        obj = api.seed(
            res.RESOURCE_CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": f"claim-{uuid.uuid4().hex[:8]}",
                    "namespace": draw(st.sampled_from(["team", "team", "other"])),
                },
                "spec": {"devices": {"requests": [{"name": "channel"}]}},
                "status": status,
            },
        )
        meta = dict(obj["metadata"])
        if how == "wrong uid":
            meta["uid"] = str(uuid.uuid4())
        refs.append(meta)
    return refs


def test_generated_grpc_requests_get_per_claim_errors_and_leave_nothing(
    api: FakeApiServer,
) -> None:
    tally = Tally(
        "gRPC requests",
        what="NodePrepareResources + NodeUnprepareResources (v1 and v1beta1) with 0-4 claims: "
        "generated claims, wrong UIDs, made-up references (any UTF-8, 300-character UIDs), "
        "duplicates; outcomes count claims, not requests",
        where="per-claim error text of the gRPC response (kubelet Event "
        "FailedPrepareDynamicResources)",
    )
    cd_a = seed_domain(api, namespace="team")
    cd_b = seed_domain(api, namespace="other", clique="")
    with short_tmpdir() as root, running_plugin(api, root) as (plugin, kubelet):
        # A prepared daemon claim that every request must leave alone.
        daemon = seed_claim(
            api,
            namespace=DRIVER_NS,
            device="daemon-0",
            request="daemon",
            params={"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd_a},
        )
        baseline = kubelet.prepare(daemon).claims[daemon["metadata"]["uid"]]
        assert not baseline.error and baseline.devices
        cdi_before = sorted(p.name for p in plugin.config.cdi_root.iterdir())

        @seed(SEED)
        @suite_settings(examples(30))
        @given(
            refs=grpc_claims(api, [cd_a, cd_a, cd_b, str(uuid.uuid4())]),
            version=st.sampled_from(["v1", "v1beta1"]),
        )
        def case(refs: list[dict[str, Any]], version: str) -> None:
            tally.case()
            uids = {r.get("uid", "") for r in refs}
            response = kubelet.prepare(*refs, version=version, timeout=30)
            assert set(response.claims) == uids
            for uid, result in response.claims.items():
                tally.count(_classify(uid, result.error, bool(result.devices), refs, "prepare"))
            response = kubelet.unprepare(*refs, version=version)
            assert set(response.claims) == uids
            for uid, result in response.claims.items():
                if result.error:
                    tally.count(_classify(uid, result.error, False, refs, "unprepare"))
            # Nothing left on the node but the baseline claim, which is untouched, and the
            # PrepareAborted tombstones of claims unprepared before they completed (no devices;
            # expired here so that the next example starts clean).
            left = plugin.store.entries()
            assert {u for u, e in left.items() if e.state != ClaimState.PREPARE_ABORTED} == {
                daemon["metadata"]["uid"]
            }
            assert plugin.state is not None
            plugin.state.expire_aborted(ttl=0.0)
            assert decode_checkpoint(plugin.store.path.read_bytes()).problems == ()
            assert sorted(p.name for p in plugin.config.cdi_root.iterdir()) == cdi_before
            node = api.client().get(res.NODES, NODE)
            assert c.COMPUTE_DOMAIN_LABEL not in (node["metadata"].get("labels") or {})

        case()
        # Still serving: the baseline claim's devices come back unchanged.
        again = kubelet.prepare(daemon).claims[daemon["metadata"]["uid"]]
        assert not again.error and list(again.devices) == list(baseline.devices)
    assert tally.outcomes["prepare: prepared"] > 0
    tally.save()


def _classify(uid: str, error: str, devices: bool, refs: list[dict[str, Any]], verb: str) -> str:
    if not error:
        return f"{verb}: prepared" if devices else f"{verb}: nothing of ours"
    ref = [r for r in refs if r.get("uid", "") == uid][-1]  # duplicates: the last one counts
    claim = f"'{ref.get('namespace', '')}/{ref.get('name', '')}:{uid}'"
    assert error.startswith(f"error {verb[:-1]}ing devices for claim {claim}: "), error
    assert "internal error" not in error, error
    kind, _, message = error.split(": ", 1)[1].partition(": ")
    assert kind in ("permanent error", "retryable error"), error
    return f"{verb}: {kind} ({plugin_error_kind(message)})"


PLUGIN_ERRORS = [
    (r"^invalid claim reference: (uid|namespace|name) ", "invalid claim reference"),
    (r"^ResourceClaim \S+ not found$", "claim not found"),
    (r"^ResourceClaim \S+ has UID \S+, not ", "claim UID differs"),
    (r"^ResourceClaim \S+ is not allocated$", "claim not allocated"),
    (r"^ComputeDomain with UID \S+ not found$", "ComputeDomain not found"),
    (r"^the ResourceClaim's namespace is different", "ComputeDomain in another namespace"),
    (r"^ComputeDomain daemon claims are only prepared in the driver namespace ", "daemon claim"),
    (
        r"^allocation failed: channel 0 already allocated by claim \S+ "
        r"\(according to checkpoint\)$",
        "channel 0 in use",
    ),
    (r"^requested device \S+ is already allocated to different claim ", "device held"),
    (r"^stale prepare for claim \S+: claim prepare was already aborted$", "stale prepare"),
]


def plugin_error_kind(message: str) -> str:
    """What a per-claim error is about; fails the test on an unexpected message."""
    for pattern, kind in PLUGIN_ERRORS:
        if re.search(pattern, message):
            return kind
    return claim_error_kind(message)
