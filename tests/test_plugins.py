"""Issue 27 §1 and §4: a method in the user's own file (config key ``method_modules``), registered
like the built-in ones, its file's digest in its runs' settings; the example plug-in
(``examples/methods/debiased.py``) against an independent computation of its paper's equation.
The tiny DAG with the plug-in is in ``tests/test_workflow.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, tiny_run
from sentemb import SentembError

EXAMPLE = REPO / "examples" / "methods" / "debiased.py"


@pytest.fixture
def clean_registry():
    """The registries (methods, input kinds) as they were before the test (a plug-in imported here is not
    seen by later tests)."""
    import sentemb.stats.inputs as inputs
    import sentemb.methods as methods

    methods.registry()
    before = (dict(methods._REGISTRY), dict(methods._IMPORTED), dict(methods._SPEC), dict(inputs.INPUTS))
    yield
    for d, old in zip((methods._REGISTRY, methods._IMPORTED, methods._SPEC, inputs.INPUTS), before):
        d.clear()
        d.update(old)


def _example():
    from sentemb.methods import import_method_module

    name = import_method_module(str(EXAMPLE))
    return sys.modules[name]


def _reference(z1: np.ndarray, z2: np.ndarray, t: float, tau_plus: float) -> float:
    """Chuang et al. (2020) Eq. (6), M = 1, written out per row in float64 without any shift."""
    z1 = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
    z2 = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
    b = len(z1)
    out = []
    for i in range(b):
        pos = np.exp(z1[i] @ z2[i] / t)
        negs = [np.exp(z1[i] @ z2[j] / t) for j in range(b) if j != i]
        n = len(negs)
        g = max((np.mean(negs) - tau_plus * pos) / (1 - tau_plus), np.exp(-1 / t))
        out.append(-np.log(pos / (pos + n * g)))
    return float(np.mean(out))


def test_the_example_loss_is_its_equation_and_infonce_at_zero_prior(clean_registry):
    from sentemb.methods.simcse import info_nce

    mod = _example()
    torch.manual_seed(0)
    z1, z2 = torch.randn(8, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    z2 = z1 + 0.5 * z2  # positives closer than negatives, as after a few steps
    for t, tp in ((0.05, 0.1), (0.2, 0.3), (0.05, 0.0)):
        got = float(mod.debiased_info_nce(z1, z2, t, tp))
        # the method computes in fp32 (as under autocast): round-off ~1e-7 of the logits, absolute
        assert got == pytest.approx(_reference(z1.numpy(), z2.numpy(), t, tp), rel=1e-5, abs=1e-6), (t, tp)
    # τ⁺ = 0 is SimCSE's InfoNCE (whose fp32 cross-entropy, logsumexp − logit, rounds at ~1e-6 absolute)
    assert float(mod.debiased_info_nce(z1, z2, 0.05, 0.0)) == pytest.approx(float(info_nce(z1, z2, 0.05)), abs=2e-6)
    z3 = torch.randn(8, 16, dtype=torch.float64)
    assert float(mod.debiased_info_nce(z1, z3, 0.1, 0.0)) == pytest.approx(float(info_nce(z1, z3, 0.1)), rel=1e-5)
    # the floor e^{-1/t} binds when the corrected negative term would go below it
    far = torch.cat([z1[:1], -z1[:1]])
    assert float(mod.debiased_info_nce(far, far.flip(0) * -1, 0.5, 0.9)) == pytest.approx(
        _reference(far.numpy(), (far.flip(0) * -1).numpy(), 0.5, 0.9), rel=1e-5)


def test_a_plugin_s_digest_covers_its_package_and_what_a_one_file_plugin_binds_beside_it(clean_registry, tmp_path,
                                                                                          monkeypatch):
    """``method_digest`` (``sentemb.methods.code_digest``): a method of a package listed by module name
    has every Python file of its top-level package in its digest (an edit to any reruns its jobs; one
    outside the package does not), the same whatever else was imported; a one-file plug-in's digest is
    its file's sha256, or also covers a module it loads from beside it (the PromptBERT example's);
    sentemb's own files never count."""
    import hashlib
    import sys

    from sentemb.methods import code_digest, get_method, import_method_module, method_files, method_source

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    pkg = tmp_path / "mymethods"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "losses.py").write_text("def scaled(x):\n    return 2.0 * x\n")
    (pkg / "sub" / "schedule.py").write_text("def warm(step):\n    return step\n")
    (pkg / "other.py").write_text("X = 1\n")
    (tmp_path / "outside.py").write_text("Y = 1\n")
    (pkg / "method.py").write_text(
        "from sentemb.methods import register_method\n"
        "from sentemb.methods.simcse import SimCSE\n\n"
        "from mymethods.losses import scaled\n\n\n"
        "class Proxy:\n"
        "    @property\n"
        "    def __class__(self):\n"
        "        raise RuntimeError('no class here')\n\n\n"
        "PROXY = Proxy()\n\n\n"
        "@register_method\n"
        "class Scaled(SimCSE):\n"
        "    name = 'scaled-simcse'\n")
    try:
        import_method_module("mymethods.method")
        cls = get_method("scaled-simcse")
        files = method_files(cls)
        assert files[0] == (pkg / "method.py").resolve()
        assert set(files) == {(pkg / f).resolve() for f in ("method.py", "__init__.py", "losses.py", "other.py",
                                                            "sub/schedule.py")}
        spec, digest = method_source(cls)
        assert spec == "mymethods.method" and len(digest) == 64
        import mymethods.other  # noqa: F401 - imported later: the same files, the same digest
        (tmp_path / "outside.py").write_text("Y = 2\n")
        assert method_source(cls)[1] == digest
        for f in ("losses.py", "other.py", "sub/schedule.py", "__init__.py"):
            (pkg / f).write_text((pkg / f).read_text() + "# an edit\n")
            assert method_source(cls)[1] != digest, f  # each one's edit reruns the method's jobs
            digest = method_source(cls)[1]
        one = tmp_path / "one.py"
        one.write_text(EXAMPLE.read_text())
        mod = sys.modules[import_method_module(str(one))]
        own = [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == mod.__name__ and hasattr(v, "name")]
        assert own and code_digest(own[0]) == hashlib.sha256(one.read_bytes()).hexdigest()
        assert method_files(own[0]) == [one.resolve()]
    finally:
        for m in [m for m in sys.modules if m == "mymethods" or m.startswith("mymethods.")]:
            del sys.modules[m]
    # the examples: PromptBERT loads promptbert_st.py from beside it; ESimCSE is one file
    import_method_module(str(REPO / "examples" / "methods" / "promptbert.py"))
    import_method_module(str(REPO / "examples" / "methods" / "esimcse.py"))
    ex = REPO / "examples" / "methods"
    assert method_files(get_method("promptbert")) == [(ex / "promptbert.py").resolve(), (ex / "promptbert_st.py").resolve()]
    assert code_digest(get_method("esimcse")) == hashlib.sha256((ex / "esimcse.py").read_bytes()).hexdigest()
    assert method_files(get_method("simcse")) == [(REPO / "src" / "sentemb" / "methods" / "simcse.py").resolve()]


def test_code_in_site_packages_is_not_the_user_s_code(tmp_path):
    """A package under a ``site-packages`` folder put on the path (pip --target, a module tree) is an
    installed package, not a method's code; a file of the working directory is."""
    from sentemb.methods import _installed

    lib = tmp_path / "opt" / "lib" / "site-packages" / "tqdm"
    lib.mkdir(parents=True)
    (lib / "std.py").write_text("")
    (tmp_path / "mine.py").write_text("")
    assert _installed(lib / "std.py") and _installed(lib) and not _installed(tmp_path / "mine.py")


def test_a_plugin_is_a_method_its_digest_in_its_runs_only(clean_registry, tmp_path, monkeypatch):
    """``method_modules`` (a path relative to the working directory): registered, its arguments
    validated like a built-in's, its runs carry ``method_module`` and the sha256 of its file, and
    editing the file changes those runs' settings (so Snakemake reruns them) and no other run's."""
    from sentemb.config.load import load_config, resolve_run
    from sentemb.methods import get_method, registry
    from sentemb.train.loop import run_fingerprint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    plugin = tmp_path / "mine" / "debiased.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["method_modules"] = ["mine/debiased.py"]
    cfg["studies"] = []
    cfg["runs"] = [cfg["runs"][0], {"method": "debiased-simcse", "backbone": "tiny-bert", "method_args": {"tau_plus": 0.2}}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    config = load_config(tmp_path / "c.yaml")
    assert "debiased-simcse" in registry() and get_method("debiased-simcse").__name__ == "DebiasedSimCSE"
    mine, builtin = resolve_run(config, "debiased-simcse", "tiny-bert", 1), resolve_run(config, "simcse", "tiny-bert", 1)
    assert mine.method_module == "mine/debiased.py" and len(mine.method_digest) == 64
    assert builtin.method_module is None and "method_digest" not in builtin.to_dict()
    assert mine.method_args == {"temperature": 0.05, "mlp": "train_only", "tau_plus": 0.2}
    plugin.write_text(plugin.read_text() + "\n# an edit\n")
    mine2, builtin2 = resolve_run(config, "debiased-simcse", "tiny-bert", 1), resolve_run(config, "simcse", "tiny-bert", 1)
    assert mine2.method_digest != mine.method_digest and builtin2.to_dict() == builtin.to_dict()
    assert {k for k in mine.to_dict() if mine.to_dict()[k] != mine2.to_dict()[k]} == {"method_digest"}
    assert run_fingerprint(mine2) != run_fingerprint(mine)  # a state of the old file is not resumed
    # its declared range is enforced when the config is validated, naming the key
    cfg["runs"][1]["method_args"] = {"tau_plus": 1.0}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.tau_plus: 1\.0 must be less than 1"):
        load_config(tmp_path / "c.yaml")


def test_bad_plugins_are_refused_naming_the_key(clean_registry, tmp_path, monkeypatch):
    from sentemb.config.load import load_config

    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())

    def load(modules):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "method_modules": modules}))
        return load_config(tmp_path / "c.yaml")

    with pytest.raises(SentembError, match=r"config key method_modules\[0\]: nowhere\.py: no such file"):
        load(["nowhere.py"])
    (tmp_path / "broken.py").write_text("import sentemb\nraise RuntimeError('half-written')\n")
    with pytest.raises(SentembError, match=r"method_modules\[0\]: importing broken\.py failed: RuntimeError: half-written"):
        load(["broken.py"])
    (tmp_path / "shadow.py").write_text(
        "from sentemb.methods import register_method\nfrom sentemb.methods.simcse import SimCSE\n\n"
        "@register_method\nclass Mine(SimCSE):\n    name = 'simcse'\n")
    with pytest.raises(SentembError, match=r"the name is the built-in sentemb\.methods\.simcse\.SimCSE's"):
        load(["shadow.py"])
    with pytest.raises(SentembError, match=r"method_modules\[0\]: importing no_such_package_xyz failed"):
        load(["no_such_package_xyz"])


def test_register_method_names_the_mistakes_a_plugin_file_makes(clean_registry, tmp_path, monkeypatch, caplog):
    """A class without ``name``, an ``Args`` without ``@dataclass`` (its arguments would be dropped
    silently), two different files registering one name (the last would win silently; a copy of the
    same file is the same plug-in), and a file whose class was never registered (named by "unknown
    method") each get an error that says what to do; the same file imported again (by a link, or as
    another module) still replaces its class."""
    from sentemb.methods import get_method, import_method_module

    monkeypatch.chdir(tmp_path)
    head = "from sentemb.methods import Method, arg, register_method\nfrom sentemb.methods.simcse import SimCSE\n\n"
    (tmp_path / "noname.py").write_text(head + "@register_method\nclass Scratch(Method):\n    pass\n")
    with pytest.raises(SentembError, match=r"@register_method on Scratch \(.*noname\.py\): the class has no `name`"):
        import_method_module("noname.py")
    (tmp_path / "nodc.py").write_text(head + "@register_method\nclass NoDC(SimCSE):\n    name = 'nodc'\n\n"
                                      "    class Args(SimCSE.Args):\n        p: float = arg(0.5, 'a share')\n")
    with pytest.raises(SentembError, match=r"its Args is not a dataclass, so its arguments p would be ignored; "
                                           r"decorate it with @dataclass"):
        import_method_module("nodc.py")
    (tmp_path / "baddef.py").write_text(
        "from dataclasses import dataclass\n" + head + "@register_method\nclass BadDef(SimCSE):\n    name = 'baddef'\n\n"
        "    @dataclass\n    class Args(SimCSE.Args):\n        scale: int = arg(0.5, 'a scale')\n"
        "        weight: float = arg(-1.0, 'a weight', minimum=0)\n        warm: int = arg(None, 'warm-up steps')\n")
    with pytest.raises(SentembError, match=r"@register_method on BadDef \(.*baddef\.py\): 3 default\(s\) break their own "
                                           r"declaration: defaults\.scale: 0\.5 is not an integer; defaults\.weight: -1\.0 "
                                           r"is below the minimum 0; defaults\.warm: None .*\(a default of None needs the "
                                           r"type `int \| None`\)"):
        import_method_module("baddef.py")
    one = head + "@register_method\nclass Twice(SimCSE):\n    name = 'twice'\n"
    (tmp_path / "a.py").write_text(one)
    (tmp_path / "b.py").write_text(one.replace("SimCSE):", "SimCSE):  # another method of the same name"))
    (tmp_path / "copy.py").write_text(one)  # a copy of a.py (a job's folder): the same plug-in
    import_method_module("a.py")
    import_method_module("copy.py")
    with pytest.raises(SentembError, match=r"method 'twice' is registered twice: by Twice in .*copy\.py and by Twice in "
                                           r".*b\.py; give one of the classes another `name`"):
        import_method_module("b.py")
    (tmp_path / "link.py").symlink_to(tmp_path / "a.py")  # the same file again: no error
    import_method_module("link.py")
    assert get_method("twice").__name__ == "Twice"
    # the same file executed again as another module (an entry point's name for it): its class replaces
    import importlib.util

    spec = importlib.util.spec_from_file_location("another_name_for_a", tmp_path / "a.py")
    again = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "another_name_for_a", again)
    spec.loader.exec_module(again)
    assert get_method("twice") is again.Twice
    (tmp_path / "noreg.py").write_text(head + "class NoReg(SimCSE):\n    name = 'noreg'\n")
    import logging

    # the logger itself, whatever earlier tests did to logging (a dictConfig that disabled existing
    # loggers, a "sentemb" logger that does not propagate): the suite's order must not decide this
    lg = logging.getLogger("sentemb.methods")
    monkeypatch.setattr(lg, "disabled", False)
    lg.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="sentemb.methods"):
            import_method_module("noreg.py")
    finally:
        lg.removeHandler(caplog.handler)
    assert "noreg.py defines NoReg but registers no method (a method class is decorated with @register_method" \
        in caplog.text
    with pytest.raises(SentembError, match=r"unknown method 'noreg' .*\]\); noreg\.py registered no method: "
                                           r"is its class decorated with @register_method"):
        get_method("noreg")


def test_the_docs_pytest_snippet_runs_the_contract_on_the_example(tmp_path):
    """The pytest snippet of docs/methods/writing-a-method.md §4, as written, in a fresh pytest run
    from the repository (two of its checks, for time): it imports the plug-in it checks."""
    import re

    text = (REPO / "docs" / "methods" / "writing-a-method.md").read_text()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def test_my_method" in b)
    (tmp_path / "test_snippet.py").write_text(snippet)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-o", "addopts=",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_snippet.py"), "-k", "arguments or buckets"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "2 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_a_training_job_imports_its_runs_plugin(tiny_bert_dir, tiny_corpus, tmp_path):
    """``sentemb train --run-config`` in a fresh process (as a Snakemake job): the run's
    ``method_module`` is imported before the method is looked up; the loss it logs is the plug-in's."""
    from sentemb.methods import method_source

    mod_dir = tmp_path / "work"
    mod_dir.mkdir()
    (mod_dir / "debiased.py").write_text(EXAMPLE.read_text())
    run = tiny_run(tiny_bert_dir, tiny_corpus, None, "simcse", max_steps=2, eval_steps=100, eval_at_end=False,
                   model_selection="last")
    d = run.to_dict()
    d.update(method="debiased-simcse", name="debiased-simcse", method_module="debiased.py", method_digest="x",
             method_args={**d["method_args"], "tau_plus": 0.1})
    (mod_dir / "run.json").write_text(json.dumps(d))
    p = subprocess.run([sys.executable, "-m", "sentemb", "train", "--run-config", "run.json", "--output-dir", "out",
                        "--no-track", "--quiet"], cwd=mod_dir, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((mod_dir / "out" / "train.json").read_text())
    assert summary["steps"] == 2 and (mod_dir / "out" / "model").is_dir()
    assert method_source  # (the in-process registry is untouched by the subprocess)


def test_the_example_config_runs_it_next_to_simcse(clean_registry, monkeypatch):
    from sentemb.config.load import load_config, resolve_run

    monkeypatch.chdir(REPO)  # its method_modules path is relative to the repository root
    config = load_config(REPO / "examples" / "methods" / "config.yaml")
    assert [r["method"] for r in config["runs"]] == ["simcse", "debiased-simcse", "esimcse", "promptbert"]
    run = resolve_run(config, "debiased-simcse", "minilm", 42)
    assert run.method_module == "examples/methods/debiased.py" and run.method_args["tau_plus"] == 0.1


def test_the_try_config_is_the_tiny_world_for_a_plugin(clean_registry, monkeypatch):
    """``examples/methods/try.yaml`` (a plug-in through the DAG in about a minute): a random 2-layer
    BERT, 192 sentences, the example next to SimCSE, its corpus under a name of its own (the prepared
    corpus is one file per name in resources_dir, which the demo's and the example's configs share)."""
    from sentemb.config.load import load_config, resolve_run

    monkeypatch.chdir(REPO)
    config = load_config(REPO / "examples" / "methods" / "try.yaml")
    assert [r["method"] for r in config["runs"]] == ["simcse", "debiased-simcse"]
    run = resolve_run(config, "debiased-simcse", "tiny-bert", 42)
    assert run.method_module == "examples/methods/debiased.py" and run.train.device == "cpu"
    assert config["backbones"]["tiny-bert"]["random_init"]["num_hidden_layers"] == 2
    others = [load_config(REPO / p)["corpus"] for p in ("config/demo.yaml", "examples/methods/config.yaml")]
    assert all(c["name"] != config["corpus"]["name"] for c in others)


# ------------------------------------------------------------------------------------ issue 27 §2: check-method
def _check_method(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "sentemb", "check-method", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900)


def _lines(out: str) -> dict[str, str]:
    """check -> status from ``sentemb check-method``'s one line per check."""
    from sentemb.testing import CHECKS

    got = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("PASS", "FAIL", "SKIP") and parts[1] in CHECKS:
            got[parts[1]] = parts[0]
    return got


def test_check_method_passes_the_example_plugin_from_its_config():
    """``sentemb check-method debiased-simcse --config examples/methods/config.yaml``: the example
    plug-in (imported by the config's method_modules) passes every check; one line per check."""
    from sentemb.testing import CHECKS

    p = _check_method("debiased-simcse", "--config", "examples/methods/config.yaml")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    got = _lines(p.stdout)
    assert list(got) == list(CHECKS), p.stdout
    # no pretraining stage, no state; not declared fusable (a SimCSE subclass declares it again: Method.fusable)
    skipped = {"pretrain", "fused"} | {k for k in CHECKS if k.startswith("state_")}
    assert all(v == ("SKIP" if k in skipped else "PASS") for k, v in got.items()), p.stdout
    assert f"debiased-simcse: 11 passed, 0 failed, {len(skipped)} skipped" in p.stdout


BROKEN = '''
import torch

from sentemb.methods import register_method, WEIGHTED
from sentemb.methods.simcse import SimCSE


@register_method
class Unseeded(SimCSE):
    """SimCSE whose batch carries noise from the global generator: not a function of (seed, micro)."""

    name = "broken-unseeded"

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        batch = super().build_batch(sentences, step, lines=lines, micro=micro)
        batch["noise"] = torch.rand(len(sentences))
        return batch


@register_method
class Misweighted(SimCSE):
    """SimCSE that logs a weighted term twice its contribution to the loss."""

    name = "broken-weights"

    def losses(self, batch):
        out = super().losses(batch)
        out[WEIGHTED] = {k: 2 * v for k, v in out[WEIGHTED].items()}
        return out


@register_method
class Clamped(SimCSE):
    """SimCSE that skips the loss on a host-side test of its value: right eagerly, but a CUDA graph
    cannot replay it (the `if` reads the device on the host)."""

    name = "broken-host-read"

    def batch_terms(self, emb, batch):
        out = super().batch_terms(emb, batch)
        if out["contrastive"] > 1e6:
            return {WEIGHTED: {}}
        return out


@register_method
class Unbucketed(SimCSE):
    """SimCSE plus each sentence's words reversed as a hard negative, tokenized here without
    ``pad_rows`` and encoded in the views' forward: right without buckets (the reversed rows are as
    wide as the sentences'), a size mismatch where ``train.buckets`` pads the sentences (CUDA)."""

    name = "broken-unbucketed"

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        batch = dict(self.tokenize(sentences, lines))
        rev = self.tokenizer([" ".join(s.split()[::-1]) for s in sentences], padding=True, truncation=True,
                             max_length=self.ctx.max_len, return_tensors="pt")
        batch.update({"rev_" + k: v for k, v in rev.items()})
        return batch

    def encode(self, batch):
        from sentemb.methods import Encoded

        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch]
        n = batch["input_ids"].size(0)
        rows = {k: torch.cat([batch[k], batch[k], batch["rev_" + k]]) for k in keys}
        h = self.encoder(**rows, return_dict=True).last_hidden_state[:, 0]
        return Encoded(batch={"z1": h[:n], "z2": h[n:2 * n]})
'''


@pytest.mark.parametrize("method, failing", [("broken-unseeded", "batches"), ("broken-weights", "loss"),
                                             ("broken-host-read", "graphs"), ("broken-unbucketed", "buckets")])
def test_check_method_names_the_check_a_broken_method_fails(tmp_path, method, failing):
    (tmp_path / "broken.py").write_text(BROKEN)
    p = _check_method(method, "--method-module", "broken.py", "--check", "batches", "--check", "loss",
                      "--check", "buckets", "--check", "export", "--check", "graphs", cwd=tmp_path)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    got = _lines(p.stdout)
    assert got[failing] == "FAIL" and all(v == "PASS" for k, v in got.items() if k != failing), p.stdout
    line = next(x for x in p.stdout.splitlines() if x.startswith(f"FAIL  {failing}"))
    assert {"batches": "batch['noise'] differs for the same (seed, micro)",
            "loss": "the weighted terms sum to",
            "graphs": "broken.py:41 in batch_terms: aten._local_scalar_dense reads a device value on the host",
            "buckets": "('rev_input_ids'); pad every row group the method tokenizes itself with self.pad_rows"}[failing] \
        in line, line
    assert p.stdout.rstrip().endswith(f"failed: {failing}"), p.stdout


def test_check_method_refuses_an_unknown_check_and_method():
    p = _check_method("simcse", "--check", "nosuch")
    assert p.returncode != 0 and "--check nosuch: unknown check" in p.stderr
    p = _check_method("no-such-method")
    assert p.returncode != 0 and "no-such-method" in p.stderr


# ------------------------------------------------------------------------------------ issue 27 §3: a plug-in's input kind
COUNTED = '''
import json
import os
from pathlib import Path

from sentemb.stats.inputs import InputKind, register_input
from sentemb.methods import register_method
from sentemb.methods.simcse import SimCSE


def _count_words(work, corpus, model_dir, config):
    counts = {}
    for line in Path(corpus).read_text("utf-8").splitlines():
        for w in line.split():
            counts[w] = counts.get(w, 0) + 1
    (Path(work) / "counts.json").write_text(json.dumps(counts))
    return Path(work) / "counts.json"


register_input(InputKind("word_counts", "whitespace word counts of the corpus", build=_count_words))


@register_method
class Counted(SimCSE):
    """SimCSE that reads an input kind of its own (the corpus's word counts)."""

    name = "simcse-counted"

    @classmethod
    def requires(cls, args):
        return ("word_counts",)

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        self.counts = json.loads((Path(ctx.inputs["word_counts"]) / "counts.json").read_text())
'''


def test_a_plugins_own_input_kind_is_one_entry_built_by_the_contract_the_cli_and_the_dag(
        clean_registry, tmp_path, monkeypatch, shared, tiny_bert_dir, tiny_corpus):
    """Issue 27 §3: a plug-in registers an input kind with its build (``register_input``); the
    contract's tiny world builds it, ``sentemb make-input`` makes it, and the DAG plans rule
    ``make_input`` for it before the run's training, at results/stats/<corpus>/inputs/<kind>.<backbone>."""
    from sentemb import testing
    from sentemb.config.load import load_config, run_inputs
    from sentemb.methods import get_method

    monkeypatch.chdir(tmp_path)
    (tmp_path / "counted.py").write_text(COUNTED)
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.update(method_modules=["counted.py"], studies=[], baselines={},
               runs=[{"method": "simcse-counted", "backbone": "tiny-bert", "seeds": [1], "train": {"max_steps": 2}}])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    config = load_config(tmp_path / "config.yaml")
    path = run_inputs(config, "simcse-counted", "tiny-bert")["word_counts"]
    assert path == f"{config['results_dir']}/stats/{config['corpus']['name']}/inputs/word_counts.tiny-bert"
    # the contract's tiny world builds it (a folder), and the method reads it
    h = testing.harness(get_method("simcse-counted"), tmp_path / "h", model_dir=tiny_bert_dir)
    assert (Path(h.inputs["word_counts"]) / "counts.json").is_file()
    testing.run_check("simcse-counted", "batches", h)
    # the CLI the rule runs
    p = subprocess.run([sys.executable, "-m", "sentemb", "make-input", "word_counts", "--corpus", str(tiny_corpus),
                        "--model", str(tiny_bert_dir), "--method-module", "counted.py", "--output", "out/wc"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((tmp_path / "out/wc/counts.json").read_text())["the"] > 0
    # the DAG: make_input for this corpus and backbone, before the training that reads it
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n",
                        "--configfile", str(tmp_path / "config.yaml"), "--cores", "1", "results/table1.csv"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "SENTEMB_MIRROR": str(shared)})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "rule make_input:" in out and "kind=word_counts" in out and path in out, out[-3000:]
    assert "rule train:" in out


# ------------------------------------------------------------------------------------ issue 39 §3: PromptBERT
PROMPTBERT = REPO / "examples" / "methods" / "promptbert.py"


def _promptbert(tmp_path, args=None, max_len=16):
    from sentemb import testing
    from sentemb.methods import MethodContext, import_method_module
    from sentemb.model.backbone import load_encoder

    sys.modules[import_method_module(str(PROMPTBERT))]
    h = testing.harness("promptbert", tmp_path, args=args or {})
    enc, tok = load_encoder(h.model_dir, pooling_layer=False)
    return h, h.cls(enc, tok, h.args, MethodContext(max_len=max_len, seed=3, corpus=h.corpus))


def test_promptbert_is_the_denoised_mask_state_of_two_templates(clean_registry, tmp_path):
    """Jiang et al. (2022): h_i = BERT(T(x_i))_[MASK], ĥ_i = BERT(T(∅) at the positions of T(x_i))_[MASK],
    the training views g(h_i − ĥ_i) of templates T and T' (here without the head g: ``mlp: false``),
    recomputed from the filled template strings, one sentence at a time."""
    from sentemb.testing import SENTS

    h, m = _promptbert(tmp_path, {"mlp": False})
    m.eval()
    batch = m.build_batch(SENTS)
    with torch.no_grad():
        emb = m.encode(batch).batch
    tok, enc = m.tokenizer, m.encoder
    for view, (key, template) in enumerate((("z1", m.args.template), ("z2", m.args.template2))):
        sfx = "" if view == 0 else "2"
        for i, s in enumerate(SENTS):
            filled = tok(template.replace("[X]", s))["input_ids"]  # WordPiece: the row is the filled template's
            n = int(batch[f"attention_mask{sfx}"][i].sum())
            assert batch[f"input_ids{sfx}"][i, :n].tolist() == filled
            k = len(tok(s, add_special_tokens=False)["input_ids"])
            alone = tok(template.replace("[X]", ""))["input_ids"]
            cut = 1 + len(tok(template.split("[X]")[0], add_special_tokens=False)["input_ids"])  # [CLS] + prefix
            pos = torch.tensor([list(range(cut)) + [p + k for p in range(cut, len(alone))]])
            with torch.no_grad():
                h_i = enc(input_ids=torch.tensor([filled])).last_hidden_state[0, filled.index(tok.mask_token_id)]
                hat = enc(input_ids=torch.tensor([alone]), position_ids=pos).last_hidden_state[0, alone.index(tok.mask_token_id)]
            torch.testing.assert_close(emb[key][i], h_i - hat, atol=2e-5, rtol=1e-5)


def test_promptbert_delta_positions_code_starts_the_template_rows_at_0_on_roberta(clean_registry, tiny_roberta_dir,
                                                                                   tmp_path):
    """``delta_positions``: on RoBERTa the template-alone row of ĥ starts at the model's first position,
    padding_idx + 1 = 2 (``model``), or at 0 as the authors' get_delta (``code``); both against the
    template-alone row encoded with explicit position ids, for training's ĥ and the export's table.
    On BERT both start at 0."""
    from sentemb.methods import MethodContext
    from sentemb.model.backbone import load_encoder

    _promptbert(tmp_path / "h")  # imports the plug-in
    from sentemb.methods import get_method

    sents = ["a man plays", "the dog runs in the park"]
    got = {}
    for where in ("model", "code"):
        enc, tok = load_encoder(tiny_roberta_dir, pooling_layer=False)
        m = get_method("promptbert")(enc, tok, {"mlp": False, "delta_positions": where},
                                     MethodContext(max_len=16, seed=3, corpus=tmp_path / "none"))
        m.eval()
        head, tail = m.parts[0]
        start = 2 if where == "model" else 0
        assert m.offset == start
        batch = m.build_batch(sents)
        with torch.no_grad():
            hidden = m.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            z1 = m.encode(batch).batch["z1"]
            table = m._table(m.encoder, int(batch["lengths"].max()), True)
            for i, k in enumerate(batch["lengths"].tolist()):
                alone = head + tail
                pos = torch.tensor([[start + j if j < len(head) else start + j + k for j in range(len(alone))]])
                hat = m.encoder(input_ids=torch.tensor([alone]), position_ids=pos).last_hidden_state[0, alone.index(m.mask_id)]
                mask_at = int(batch["mask_pos"][i])
                torch.testing.assert_close(z1[i], hidden[i, mask_at] - hat, atol=2e-5, rtol=1e-5)
                torch.testing.assert_close(table[k], hat, atol=2e-5, rtol=1e-5)
        got[where] = z1
    assert not torch.allclose(got["model"], got["code"], atol=1e-4)  # the switch changes something on RoBERTa
    _, bert = _promptbert(tmp_path / "b", {"delta_positions": "code"})
    assert bert.offset == 0 == _promptbert(tmp_path / "c")[1].offset


def test_promptbert_rows_count_the_template_and_max_len_is_enforced(clean_registry, tmp_path):
    """A row is max_len − 2 sentence pieces + the template's tokens; a max_len whose rows would pass the
    model's positions (64 on the tiny encoder) is refused, naming max_len and the room left."""
    from sentemb.testing import SENTS

    h, m = _promptbert(tmp_path, max_len=8)
    long = " ".join(["the cat sits on the mat"] * 4)
    b = m.build_batch([long, *SENTS[:3]])
    assert int(b["lengths"][0]) == 6 and int(b["attention_mask"][0].sum()) == 6 + m.extra
    with pytest.raises(SentembError, match=r"train\.max_len 60 .* more than the model's 64 positions; lower max_len "
                                           rf"to at most {64 - m.extra + 2}"):
        _promptbert(tmp_path, max_len=60)


def test_promptbert_exports_its_evaluation_embedding(clean_registry, tmp_path):
    """Without denoising and the period (the contract runs ``eval_denoise: true``) the export = the dev
    embedder = `sentemb evaluate` = SentenceTransformer(path); its modules.json names the module copied
    beside the weights."""
    from sentemb import testing

    h, _ = _promptbert(tmp_path, {"dev_denoise": False, "eval_period": False})
    testing.check_export(h)
    out = next((tmp_path).glob("export-*/model"))
    assert json.loads((out / "modules.json").read_text())[0]["type"] == "promptbert_st.PromptTransformer"
    assert (out / "promptbert_st.py").is_file() and not (out / "promptbert_denoise.safetensors").exists()
    # a fresh `sentemb evaluate` process: the plug-in is imported again from the model's method_module
    import sentemb.methods as methods
    from sentemb.evaluate.sts import embedder_for

    want = embedder_for(out, "method", device="cpu")(testing.SENTS)
    methods._REGISTRY.pop("promptbert")
    methods._IMPORTED.clear()
    assert json.loads((out / "sentemb.json").read_text())["method_module"] == str(PROMPTBERT)
    np.testing.assert_array_equal(embedder_for(out, "method", device="cpu")(testing.SENTS), want)


def test_promptbert_delta_per_length_is_one_template_row_per_length_shared(clean_registry, tmp_path):
    """delta: per_length (the authors' get_delta): one template row for every sentence length 0..max_len − 2,
    each with its own dropout, and the sentences of one length share its ĥ; per_sentence: a row per
    sentence. In eval mode (no dropout) both give the same views."""
    import torch

    from sentemb.testing import SENTS

    seen = []
    views = {}
    for delta in ("per_length", "per_sentence"):
        h, m = _promptbert(tmp_path / delta, {"mlp": False, "delta": delta})
        hook = m.encoder.register_forward_hook(lambda mod, args, kw, out: seen.append((delta, kw.get("input_ids"))),
                                               with_kwargs=True)
        batch = m.build_batch(SENTS)
        m.eval()
        with torch.no_grad():
            views[delta] = m.encode(batch).batch["z1"]
        hook.remove()
    rows = {d: [ids.size(0) for dd, ids in seen if dd == d and ids is not None] for d in ("per_length", "per_sentence")}
    assert rows["per_length"] == [2 * len(SENTS), 16 - 1, 16 - 1]  # the views, then T's and T''s rows for 0..14
    assert rows["per_sentence"] == [2 * len(SENTS), len(SENTS), len(SENTS)]
    torch.testing.assert_close(views["per_length"], views["per_sentence"], atol=2e-5, rtol=1e-5)
    # keyed dropout (training mode): a chunk's views, its ĥ rows keyed by the length itself, are the whole
    # batch's rows of those sentences, whichever sentence the chunk starts at
    from sentemb.model.dropout import keyed

    for delta in ("per_length", "per_sentence"):
        h, m = _promptbert(tmp_path / f"{delta}-keyed", {"mlp": False, "delta": delta})
        m.train()
        batch = m.build_batch(SENTS)
        n = m.n_sentences(batch)
        with torch.no_grad():
            with keyed(5, 0, 0, n):
                whole = m.encode(batch).batch["z1"]
            for start, stop in ((0, n // 2), (n // 2, n), (1, n - 1)):
                with keyed(5, 0, start, stop):
                    part = m.encode(m.chunk(batch, start, stop)).batch["z1"]
                torch.testing.assert_close(part, whole[start:stop], atol=1e-5, rtol=1e-5)


def test_promptbert_defaults_select_on_the_denoised_state_and_evaluate_with_the_period(clean_registry, tmp_path):
    """The authors' unsup-bert: the trainer's dev embedding is h − ĥ (``--mask_embedding_sentence_delta``,
    eval mode), without a period; their evaluation.py embeds the raw h of the sentence with a period
    added where it ends in none of . ? " ' (``dev_denoise``, ``eval_period``). Both against the filled
    template strings, one sentence at a time; the export, `sentemb evaluate` and SentenceTransformer(path)
    all add the period."""
    import torch

    from sentemb.evaluate.sts import embedder_for

    sents = ["a man plays the guitar", "is it raining?", 'he said "yes"', "the end."]
    h, m = _promptbert(tmp_path)
    m.eval()
    tok, enc, t = m.tokenizer, m.encoder, m.args.template
    cut = 1 + len(tok(t.split("[X]")[0], add_special_tokens=False)["input_ids"])

    def state(s, denoise):
        filled = tok(t.replace("[X]", s))["input_ids"]
        with torch.no_grad():
            v = enc(input_ids=torch.tensor([filled])).last_hidden_state[0, filled.index(tok.mask_token_id)]
            if denoise:
                alone = tok(t.replace("[X]", ""))["input_ids"]
                k = len(tok(s, add_special_tokens=False)["input_ids"])
                pos = torch.tensor([list(range(cut)) + [p + k for p in range(cut, len(alone))]])
                v = v - enc(input_ids=torch.tensor([alone]), position_ids=pos).last_hidden_state[0, alone.index(tok.mask_token_id)]
        return v.numpy()

    dev = m.embedder("method", torch.device("cpu"))(sents)
    np.testing.assert_allclose(dev, np.stack([state(s, True) for s in sents]), atol=2e-5)
    dotted = ["a man plays the guitar.", "is it raining?", 'he said "yes"', "the end."]
    out = tmp_path / "model"
    m.export(out, "method", meta={"method": "promptbert", "name": "promptbert", "backbone": "tiny", "seed": 5})
    want = np.stack([state(s, False) for s in dotted])
    np.testing.assert_allclose(embedder_for(out, "method", device="cpu")(sents), want, atol=2e-5)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(out), device="cpu", trust_remote_code=True).encode(sents, convert_to_numpy=True)
    np.testing.assert_allclose(st, want, atol=2e-5)
    assert not np.allclose(want[0], state(sents[0], False), atol=1e-4)  # the period changed the first


def test_check_method_passes_promptbert_from_the_example_config():
    """``sentemb check-method promptbert --config examples/methods/config.yaml`` (devices and resume left
    out here, 35 s on 2 cores; both pass too)."""
    p = _check_method("promptbert", "--config", "examples/methods/config.yaml", "--skip", "devices", "--skip", "resume")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # pretrain, fused (not declared), the 6 state checks (no state) and state_epoch (no before_epoch)
    assert "promptbert: 9 passed, 0 failed, 9 skipped" in p.stdout, p.stdout


def test_the_example_configs_published_rows_reach_the_paper_table(tmp_path):
    """The config's ``published`` rows (PromptBERT's BERT-base STS) are merged with paper_results'
    (``write_published``, the workflow's rule ``published``) and placed beside a promptbert run."""
    import pandas as pd

    from sentemb.report.paper import load_paper_results, table_paper, write_published

    rows = yaml.safe_load((REPO / "examples" / "methods" / "config.yaml").read_text())["published"]
    merged = load_paper_results(write_published(REPO / "config" / "paper_results.yaml", rows, tmp_path / "p.yaml"))
    assert [e for e in merged if e["method"] == "promptbert"][-1]["scores"]["Avg"] == 78.54
    assert any(e["method"] == "simcse" for e in merged)
    sts = pd.DataFrame([{"name": n, "method": n, "backbone": "bert-base-uncased", "seed": s, "pooler": "",
                         "STSBenchmark": 80.0 + s, "STS12": 70.0} for n in ("simcse", "promptbert") for s in (1, 2)])
    t = table_paper(sts, None, merged).set_index(["name", "metric"])
    row = t.loc[[k for k in t.index if k[0] == "promptbert" and k[1] in ("STS-B", "STSBenchmark")][0]]
    assert row["published"] == 81.60 and "PromptBERT (Jiang et al. 2022)" in row["source"]
    with pytest.raises(SentembError, match=r"config key 'published'\[0\] gives run 'promptbert'"):
        write_published(tmp_path / "p.yaml", rows, tmp_path / "q.yaml")  # a second row for the same run
