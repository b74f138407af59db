"""What a build node trusts, on real loopback clusters: a task is checked against its key,
the remote cache and the signing key are the node's own, a node listens where it says, and
the whole cluster runs over TLS (certificates made here) when Dask's settings say so."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from daskfarm import make_project, start_cluster

from optbuild import api
from optbuild.builder.report import Reporter
from optbuild.common.digest import digest_bytes

pytestmark = pytest.mark.timeout(60)

RECIPE = '[steps.src]\nkind = "text"\npath = "../data/input.txt"\n\n[steps.up]\nkind = "join"\ninput = "src"\nsuffix = "!"\n'


def build(proj) -> api.BuildResult:
    ws = api.open_workspace(proj.root)
    try:
        return api.build(ws, reporter=Reporter())
    finally:
        ws.close()


@contextmanager
def signed_farm(tmp_path: Path, file_remote, monkeypatch) -> Iterator[tuple[Any, str, str]]:
    """A one-node cluster whose node signs with the farm's key, this host holding the same key:
    (the cluster, the project's [remote] section, its [build] section sending steps there)."""
    monkeypatch.setenv("OPTBUILD_TEST_SIGNING", "farm-secret")
    cluster = start_cluster(tmp_path / "farm", {"cpu": 1}, file_remote, env={"OPTBUILD_SIGNING_KEY": "farm-secret"})
    try:
        yield (cluster, file_remote.section(signing_key_env="OPTBUILD_TEST_SIGNING"),
               f'executor = "dask"\nscheduler = "{cluster.address}"\n')
    finally:
        cluster.stop()


def submit(cluster, task: dict) -> dict:
    """What the node answers to ``task`` sent straight to the scheduler, as any client could."""
    from distributed import Client

    from optbuild.distributed.task import run_task

    with Client(cluster.address, timeout=10, set_as_default=False) as client:
        return client.submit(run_task, task, pure=False, resources={"optbuild": 1}).result(timeout=30)


def test_a_forged_task_is_refused_and_the_signed_entry_stays(tmp_path, file_remote, monkeypatch):
    """A task with a real step's key and key material but other input bytes, or other key
    material under the real key, sent straight to the scheduler: the node builds, signs and
    uploads nothing, and a key holder restores the honest output."""
    with signed_farm(tmp_path, file_remote, monkeypatch) as (cluster, section, build_section):
        proj = make_project(tmp_path / "p", build=build_section, remote=section, recipe=RECIPE)
        honest = build(proj)
        assert honest.ok, (honest.reporter.events, cluster.logs())
        key = honest.outcomes["farm:src"].key
        signed_entry = file_remote.read(file_remote.entry_path(key))
        _, entry = file_remote.read_entry(key)
        forged_bytes = b"forged"
        file_remote.write(file_remote.blob_path(digest_bytes(forged_bytes)), forged_bytes)
        blobs = sorted(file_remote.fs.find(f"{file_remote.root}/cas"))

        task = {"key": key, "step": "farm:src", "implementation": "project:kinds.py:Text", "base_dir": "recipes",
                "files": {name: {"digest": digest, "size": (proj.root / name).stat().st_size}
                          for name, digest in entry["ingredients"]["files"].items()},
                "inputs": {}, "primary_output": entry["primary"], "ingredients": entry["ingredients"],
                "remote": file_remote.url, "signed": True}
        other_bytes = {**task, "files": {**task["files"], "data/input.txt": {"digest": digest_bytes(forged_bytes),
                                                                             "size": len(forged_bytes)}}}
        other_material = {**task, "ingredients": {**task["ingredients"], "params": {"path": "../data/forged.txt"}}}
        for forged, why in [(other_bytes, "input file data/input.txt changed"),
                            (other_material, "its key is not that of its key material")]:
            result = submit(cluster, forged)
            assert result["ok"] is False and result["node"] == "cpu", result
            assert result["error"].startswith("refused: the task is not what its key") and why in result["error"]

        assert file_remote.read(file_remote.entry_path(key)) == signed_entry  # nothing signed, nothing replaced
        assert file_remote.keys() == sorted(o.key for o in honest.outcomes.values())
        assert sorted(file_remote.fs.find(f"{file_remote.root}/cas")) == blobs  # nothing uploaded
        other = make_project(tmp_path / "other", build=build_section, remote=section, recipe=RECIPE)
        restored = build(other)
        assert restored.ok and sorted(restored.steps("restored")) == ["farm:src", "farm:up"], restored.reporter.events
        assert (other.root / "build/farm/up/data.txt").read_text() == "hello!"


NESTED = RECIPE.replace('suffix = "!"', 'suffix = "!"\nnested = true') + '\n[steps.down]\nkind = "join"\ninput = "up"\n'


def test_a_task_pointing_a_step_at_another_output_of_its_upstream_is_refused(tmp_path, file_remote, monkeypatch):
    """``up`` writes data.txt (its main output) and sub/extra.txt. A task for ``down`` with
    its real key and key material, whose input names sub/extra.txt as up's main output (the
    key holds up's outputs, not which is the main one): the node checks it against up's
    entry in the remote cache, and builds, signs and uploads nothing."""
    with signed_farm(tmp_path, file_remote, monkeypatch) as (cluster, section, build_section):
        proj = make_project(tmp_path / "p", build=build_section, remote=section, recipe=NESTED)
        honest = build(proj)
        assert honest.ok, (honest.reporter.events, cluster.logs())
        assert (proj.root / "build/farm/down/data.txt").read_text() == "hello!"
        key, up_key = honest.outcomes["farm:down"].key, honest.outcomes["farm:up"].key
        signed_entry = file_remote.read(file_remote.entry_path(key))
        _, entry = file_remote.read_entry(key)
        _, up = file_remote.read_entry(up_key)
        assert up["primary"] == "data.txt" and sorted(up["outputs"]) == ["data.txt", "sub/extra.txt"]
        blobs = sorted(file_remote.fs.find(f"{file_remote.root}/cas"))

        task = {"key": key, "step": "farm:down", "implementation": "project:kinds.py:Join", "base_dir": "recipes",
                "files": {name: {"digest": digest, "size": (proj.root / name).stat().st_size}
                          for name, digest in entry["ingredients"]["files"].items()},
                "inputs": {"input": {"step": "farm:up", "key": up_key, "primary": "data.txt", "outputs": up["outputs"]}},
                "primary_output": "data.txt", "ingredients": entry["ingredients"], "remote": file_remote.url,
                "signed": True}
        other_output = {**task, "inputs": {"input": {**task["inputs"]["input"], "primary": "sub/extra.txt"}}}
        another_entry = {**task, "inputs": {"input": {**other_output["inputs"]["input"],
                                                      "key": honest.outcomes["farm:src"].key}}}
        for forged, why in [
                (other_output, ("it takes sub/extra.txt as the main output of farm:up, whose entry in the "
                                "remote cache names data.txt")),
                (another_entry, "the outputs of farm:up are not those its entry")]:
            result = submit(cluster, forged)
            assert result["ok"] is False and result["node"] == "cpu", result
            assert result["error"].startswith("refused: ") and why in result["error"], result["error"]
            assert result["error"].endswith("nothing was built or stored")

        assert file_remote.read(file_remote.entry_path(key)) == signed_entry  # nothing signed, nothing replaced
        assert sorted(file_remote.fs.find(f"{file_remote.root}/cas")) == blobs  # nothing uploaded


def test_an_entry_naming_another_main_output_than_its_step_s_is_not_used(tmp_path, file_remote, monkeypatch):
    """A task for ``up`` itself that names sub/extra.txt as its main output (the key does not
    hold it): the node signs that entry, but a coordinator, which knows the step's main
    output, does not use it, builds ``up`` again and replaces it; ``down`` reads data.txt."""
    with signed_farm(tmp_path, file_remote, monkeypatch) as (cluster, section, build_section):
        proj = make_project(tmp_path / "p", build=build_section, remote=section, recipe=NESTED)
        assert build(proj).ok
        lock = json.loads(proj.read("optbuild.lock"))["steps"]
        up_key, src_key = lock["farm:up"]["key"], lock["farm:src"]["key"]
        _, up = file_remote.read_entry(up_key)
        _, src = file_remote.read_entry(src_key)
        task = {"key": up_key, "step": "farm:up", "implementation": "project:kinds.py:Join", "base_dir": "recipes",
                "files": {name: {"digest": digest, "size": (proj.root / name).stat().st_size}
                          for name, digest in up["ingredients"]["files"].items()},
                "inputs": {"input": {"step": "farm:src", "key": src_key, "primary": "data.txt",
                                     "outputs": src["outputs"]}},
                "primary_output": "sub/extra.txt", "ingredients": up["ingredients"], "remote": file_remote.url,
                "signed": True}
        assert submit(cluster, task)["ok"]
        assert file_remote.read_entry(up_key)[1]["primary"] == "sub/extra.txt"
        file_remote.delete(file_remote.entry_path(lock["farm:down"]["key"]))  # down builds from up's entry

        other = make_project(tmp_path / "other", build=build_section, remote=section, recipe=NESTED)
        result = build(other)
        assert result.ok, (result.reporter.events, cluster.logs())
        assert any("entry of farm:up rejected: it names sub/extra.txt as the step's main output, where the "
                   "step's is data.txt" in e.get("message", "") for e in result.reporter.events)
        assert sorted(result.steps("built")) == ["farm:down", "farm:up"]
        assert (other.root / "build/farm/down/data.txt").read_text() == "hello!"
        assert file_remote.read_entry(up_key)[1]["primary"] == "data.txt"  # replaced


def test_an_upstream_built_here_is_put_in_the_remote_for_the_node_to_check(tmp_path, file_remote, monkeypatch):
    """``src`` and ``up`` were built on this host, the remote cache not used: the node checks
    up's main output against its entry, so the coordinator puts that entry (signed) there."""
    with signed_farm(tmp_path, file_remote, monkeypatch) as (cluster, section, build_section):
        proj = make_project(tmp_path / "p", remote=section, recipe=NESTED)
        ws = api.open_workspace(proj.root, remote=False)
        try:
            assert api.build(ws, ["farm:up"], reporter=Reporter()).ok
        finally:
            ws.close()
        assert file_remote.keys() == []
        proj.write("optbuild.toml", proj.read("optbuild.toml").replace("[build]\n", "[build]\n" + build_section))
        result = build(proj)
        assert result.ok, (result.reporter.events, cluster.logs())
        assert result.steps("built") == ["farm:down"] and (proj.root / "build/farm/down/data.txt").read_text() == "hello!"
        head, up = file_remote.read_entry(result.outcomes["farm:up"].key)
        assert head and up["primary"] == "data.txt"  # signed: the node checked against it


def test_a_node_without_host_listens_only_where_it_reaches_the_scheduler_and_says_so(tmp_path, file_remote):
    import psutil

    from optbuild.distributed.node import reaching

    assert reaching("tcp://127.0.0.1:8786") == "127.0.0.1"
    assert reaching("tls://[::1]:8786") in ("::1", None)  # None where this host has no IPv6
    cluster = start_cluster(tmp_path / "farm", {}, file_remote)
    try:
        node = cluster.start_node("cpu", args=())  # no --host
        cluster.wait_for_nodes(1)
        listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(node.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN}
        assert listening and {ip for ip, _ in listening} == {"127.0.0.1"}, listening
        said = re.findall(r"listening on tcp://([\d.]+):(\d+)", (cluster.folder / "cpu.log").read_text())
        assert said and (said[0][0], int(said[0][1])) in listening
    finally:
        cluster.stop()


@dataclass(frozen=True)
class Tls:
    """A CA and a certificate for 127.0.0.1 that it signed (for the scheduler, the nodes and
    the coordinator alike), as PEM files."""

    ca: Path
    cert: Path
    key: Path

    def dask_env(self) -> dict[str, str]:
        """Dask's own TLS settings, as a node's environment gives them."""
        return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(self.ca),
                "DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT": str(self.cert),
                "DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY": str(self.key),
                "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "true"}

    def dask_config(self) -> dict[str, str]:
        """The same settings for the coordinator, as its Dask configuration gives them."""
        return {"distributed.comm.tls.ca-file": str(self.ca), "distributed.comm.tls.client.cert": str(self.cert),
                "distributed.comm.tls.client.key": str(self.key), "distributed.comm.require-encryption": True}

    def security(self):
        from distributed.security import Security

        return Security(tls_ca_file=str(self.ca), tls_scheduler_cert=str(self.cert), tls_scheduler_key=str(self.key),
                        tls_client_cert=str(self.cert), tls_client_key=str(self.key), require_encryption=True)


def make_tls(folder: Path) -> Tls:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True)
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                  critical=False))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                            critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    tls = Tls(folder / "ca.pem", folder / "node.pem", folder / "node-key.pem")
    tls.ca.write_bytes(certificate("optbuild test CA", ca_key, "optbuild test CA", ca_key, ca=True).public_bytes(pem))
    tls.cert.write_bytes(certificate("127.0.0.1", key, "optbuild test CA", ca_key, ca=False).public_bytes(pem))
    tls.key.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return tls


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls") / "farm")


@pytest.fixture(scope="session")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """Another CA's certificate: valid TLS, not of this cluster."""
    return make_tls(tmp_path_factory.mktemp("tls") / "stranger")


@pytest.fixture
def tls_cluster(tmp_path, file_remote, tls: Tls) -> Iterator:
    cluster = start_cluster(tmp_path / "farm", {"cpu": 1}, file_remote, env=tls.dask_env(), security=tls.security())
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_build_over_tls_succeeds(tmp_path, tls_cluster, file_remote, tls: Tls):
    import dask

    assert tls_cluster.address.startswith("tls://127.0.0.1:")
    proj = make_project(tmp_path / "p", build=f'executor = "dask"\nscheduler = "{tls_cluster.address}"\n',
                        remote=file_remote.section(), recipe=RECIPE)
    with dask.config.set(tls.dask_config()):
        result = build(proj)
    assert result.ok, (result.reporter.events, tls_cluster.logs())
    assert sorted(result.steps("built")) == ["farm:src", "farm:up"]
    assert (proj.root / "build/farm/up/data.txt").read_text() == "hello!"


def test_a_client_without_the_cluster_s_certificate_cannot_reach_a_tls_cluster(tls_cluster, stranger: Tls):
    from distributed import Client

    port = tls_cluster.address.rsplit(":", 1)[1]
    with pytest.raises((OSError, TimeoutError)):
        Client(f"tcp://127.0.0.1:{port}", timeout=3, set_as_default=False)  # plain TCP
    with pytest.raises((OSError, TimeoutError)):
        Client(tls_cluster.address, timeout=3, set_as_default=False, security=stranger.security())  # another CA
