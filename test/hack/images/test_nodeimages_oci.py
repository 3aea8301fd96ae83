"""OCI writer of ``hack/nodeimages``: digests, layout, annotations, deterministic bytes.

Also pins the driver images' references to ``config/default`` (what ``hack/build-images.sh
--print`` prints).  The driver images themselves are the ``Dockerfile``'s: see
``test_driver_images.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from nodeimages import build, debs, driver, oci

REPO = Path(__file__).resolve().parents[3]


def _tree(root: Path, *, mtime: float = 1_700_000_000.0) -> Path:
    (root / "opt" / "app" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    tool = root / "opt" / "app" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (root / "opt" / "app" / "data").write_bytes(b"\0" * 5000)
    os.link(root / "opt" / "app" / "data", root / "opt" / "app" / "data-link")
    (root / "opt" / "app" / "current").symlink_to("bin/tool")
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.utime(p, (mtime, mtime))
    return root


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def test_layer_digest_matches_bytes_and_entries_are_normalized(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    blob = oci.write_layer(root, tmp_path / "layer.tar")
    data = blob.path.read_bytes()
    assert blob.digest == _sha(data) == oci.sha256_file(blob.path)
    assert blob.size == len(data)
    assert not (tmp_path / "layer.tar.tmp").exists()
    members = _members(blob.path)
    names = [m.name for m in members]
    assert names == sorted(names, key=lambda n: n.split("/"))
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {
        (0, 0, "", "", oci.EPOCH)
    }
    by_name = {m.name: m for m in members}
    assert by_name["opt/app/bin/tool"].mode == 0o755
    assert by_name["tmp"].isdir() and by_name["tmp"].mode == 0o1777
    assert by_name["opt/app/current"].issym()
    assert by_name["opt/app/current"].linkname == "bin/tool"
    assert by_name["opt/app/data"].isfile()
    assert by_name["opt/app/data-link"].islnk()
    assert by_name["opt/app/data-link"].linkname == "opt/app/data"


def test_layer_is_deterministic_across_mtimes_and_copies(tmp_path: Path) -> None:
    a = oci.write_layer(_tree(tmp_path / "a", mtime=1e9), tmp_path / "a.tar")
    b = oci.write_layer(_tree(tmp_path / "b", mtime=1.7e9), tmp_path / "b.tar")
    assert a.digest == b.digest
    assert a.path.read_bytes() == b.path.read_bytes()


def test_layer_include_adds_parents_and_exclude_drops(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    inc = oci.write_layer(root, tmp_path / "inc.tar", include=["opt/app/bin"])
    assert [m.name for m in _members(inc.path)] == [
        "opt",
        "opt/app",
        "opt/app/bin",
        "opt/app/bin/tool",
    ]
    exc = oci.write_layer(root, tmp_path / "exc.tar", exclude=["opt"])
    assert [m.name for m in _members(exc.path)] == ["etc", "etc/passwd", "tmp"]
    with pytest.raises(oci.OCIError):
        oci.write_layer(root, tmp_path / "x.tar", include=["nope"])
    with pytest.raises(oci.OCIError):
        oci.write_layer(root, tmp_path / "x.tar", include=["../etc"])


def test_layer_refuses_special_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "fifo")
    with pytest.raises(oci.OCIError, match="only files"):
        oci.write_layer(root, tmp_path / "l.tar")


def _archive(tmp_path: Path, name: str) -> tuple[Path, list[oci.Image]]:
    root = _tree(tmp_path / f"root-{name}")
    base = oci.write_layer(root, tmp_path / f"base-{name}.tar", exclude=["opt"])
    app = oci.write_layer(root, tmp_path / f"app-{name}.tar", include=["opt"])
    images = [
        oci.Image(
            ref,
            oci.image_config(
                layers=[base, app],
                architecture="amd64",
                entrypoint=[ref.rsplit("/", 1)[-1].split(":")[0]],
                env={"PATH": "/bin", "A": "1"},
                user=user,
                working_dir="/opt/app",
                labels={"l": "v"},
                history=["base", "app"],
            ),
            [base, app],
        )
        for ref, user in (("localhost/one:0.1.0", "65532:65532"), ("localhost/two:0.1.0", "0:0"))
    ]
    out = tmp_path / f"{name}.tar"
    oci.write_archive(out, images)
    return out, images


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    assert f is not None
    return f.read()


def test_archive_layout_digests_and_annotations(tmp_path: Path) -> None:
    out, images = _archive(tmp_path, "a")
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert names[:2] == ["oci-layout", "index.json"]
        assert json.loads(_read(tar, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        blobs = {n.removeprefix("blobs/sha256/"): _read(tar, n) for n in names if n.count("/") == 2}
        for hexdigest, data in blobs.items():
            assert hashlib.sha256(data).hexdigest() == hexdigest
        index = json.loads(_read(tar, "index.json"))
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.MEDIA_INDEX
    assert len(blobs) == 2 + 2 * 2  # two shared layers, one config + manifest per image
    assert oci.read_archive_index(out) == index
    for desc, img in zip(index["manifests"], images, strict=True):
        assert desc["annotations"] == {
            oci.ANNOTATION_CONTAINERD_NAME: img.ref,
            oci.ANNOTATION_REF_NAME: "0.1.0",
        }
        assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
        manifest_bytes = blobs[desc["digest"].removeprefix("sha256:")]
        assert desc["size"] == len(manifest_bytes)
        manifest = json.loads(manifest_bytes)
        assert manifest["mediaType"] == oci.MEDIA_MANIFEST
        assert [layer["digest"] for layer in manifest["layers"]] == [b.digest for b in img.layers]
        assert {layer["mediaType"] for layer in manifest["layers"]} == {oci.MEDIA_LAYER}
        config = json.loads(blobs[manifest["config"]["digest"].removeprefix("sha256:")])
        assert config["rootfs"] == {"type": "layers", "diff_ids": [b.digest for b in img.layers]}
        assert config["config"]["Env"] == ["PATH=/bin", "A=1"]
        assert config["config"]["WorkingDir"] == "/opt/app"
        assert len(config["history"]) == 2


def test_archive_is_deterministic(tmp_path: Path) -> None:
    a, _ = _archive(tmp_path, "a")
    b, _ = _archive(tmp_path, "b")
    assert a.read_bytes() == b.read_bytes()


def test_archive_rejects_inconsistent_input(tmp_path: Path) -> None:
    _, images = _archive(tmp_path, "a")
    img = images[0]
    with pytest.raises(oci.OCIError, match="diff_ids"):
        oci.write_archive(tmp_path / "x.tar", [oci.Image(img.ref, img.config, img.layers[:1])])
    with pytest.raises(oci.OCIError, match="duplicate"):
        oci.write_archive(tmp_path / "x.tar", [img, img])
    with pytest.raises(oci.OCIError, match="digest"):
        oci.write_archive(tmp_path / "x.tar", [oci.Image("x@sha256:00", img.config, img.layers)])
    tampered = oci.Blob(img.layers[0].path, "sha256:" + "0" * 64, img.layers[0].size)
    cfg = dict(img.config, rootfs={"type": "layers", "diff_ids": [tampered.digest]})
    with pytest.raises(oci.OCIError, match="does not match"):
        oci.write_archive(tmp_path / "x.tar", [oci.Image(img.ref, cfg, [tampered])])
    assert not (tmp_path / "x.tar").exists()


def test_tag_of_references() -> None:
    index, _ = oci.layout_index(
        [
            oci.Image(ref, {"architecture": "amd64", "rootfs": {"diff_ids": []}}, [])
            for ref in ("registry:5000/a/b", "registry.k8s.io/pause:3.10.2")
        ]
    )
    tags = [m["annotations"][oci.ANNOTATION_REF_NAME] for m in index["manifests"]]
    assert tags == ["latest", "3.10.2"]


def test_canonical_json_is_sorted_and_compact() -> None:
    assert (
        oci.canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == b'{"a":[1,{"c":3,"d":2}],"b":1}'
    )


# --- config/default ---------------------------------------------------------------------------


def test_driver_refs_come_from_config_default() -> None:
    refs = build.driver_image_refs(REPO)
    assert set(refs) == set(driver.TARGETS)
    kubectl = Path(sys.executable).parent / "kubectl"
    if not kubectl.exists():
        pytest.fail(f"{kubectl} missing: install the dev extras into the venv (hack/venv.sh)")
    printed = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), "--print"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "KUBECTL": str(kubectl), "VENV": str(Path(sys.executable).parents[1])},
    ).stdout.split()
    assert sorted(refs.values()) == sorted(printed)


def test_apt_policy_parsing() -> None:
    text = (
        "libc6:\n  Installed: 2.36-9+deb12u6\n  Candidate: 2.36-9+deb12u14\n  Version table:\n"
        "     2.36-9+deb12u14 500\n"
        "zlib1g:amd64:\n  Installed: (none)\n  Candidate: 1:1.2.13.dfsg-1\n"
        "ghost:\n  Installed: (none)\n  Candidate: (none)\n"
    )
    assert debs._parse_policy(text) == {"libc6": "2.36-9+deb12u14", "zlib1g": "1:1.2.13.dfsg-1"}


def test_tar_layer_round_trips_through_tarfile(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    blob = oci.write_layer(root, tmp_path / "l.tar")
    dest = tmp_path / "out"
    with tarfile.open(blob.path) as tar:
        tar.extractall(dest, filter="fully_trusted")
    assert (dest / "opt/app/bin/tool").read_text() == "#!/bin/sh\necho hi\n"
    assert os.readlink(dest / "opt/app/current") == "bin/tool"
    assert (dest / "opt/app/data-link").stat().st_ino == (dest / "opt/app/data").stat().st_ino
    shutil.rmtree(dest)
