"""The documentation site: `mkdocs build --strict` builds README.md, docs/ and config/README.md with no
broken link or anchor (issue 28 §5), and fails when one breaks (mkdocs.yml, scripts/mkdocs_hooks.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

try:
    import material  # noqa: F401  (mkdocs-material, the theme)
    import mkdocs  # noqa: F401
except ImportError as e:
    if os.environ.get("CI"):  # CI installs the test extra: a missing mkdocs there is a failure
        raise
    pytest.skip(f"mkdocs/mkdocs-material not installed ({e}); `pip install -e '.[test]'` installs them",
                allow_module_level=True)


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0 (not a warning)
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _hooks():
    spec = importlib.util.spec_from_file_location("sentemb_mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_site_builds_strict_with_every_page(tmp_path):
    site = tmp_path / "site"
    r = _build(REPO, site)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{out}"
    assert "WARNING" not in out, out
    # every page under docs/ is in the nav and built, and so are the three generated pages
    pages = [p.relative_to(REPO / "docs").with_suffix("").as_posix() for p in (REPO / "docs").rglob("*.md")]
    for page in pages + ["config-keys", "methods"]:
        assert (site / page / "index.html").is_file(), page
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "A reproducible pipeline for unsupervised sentence embeddings" in home  # README.md
    assert 'href="configuration/#inputs-downloads-and-the-mirror"' in home  # docs/configuration.md#... rewritten
    keys = (site / "config-keys" / "index.html").read_text(encoding="utf-8")
    assert "Configuration keys" in keys  # config/README.md
    conf = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    assert 'href="../config-keys/"' in conf and 'href="../#methods"' in conf  # ../config/README.md, ../README.md#methods


def test_broken_links_fail_the_build(tmp_path):
    """A copy of the docs with one broken link of each kind: the strict build fails and names each."""
    root = tmp_path / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {"docs", "README.md", "mkdocs.yml", "site", ".git"}:
            (root / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    broken = {  # file in the copy -> a link appended to it, and what mkdocs says
        "docs/configuration.md": ("[m](../README.md#no-such-heading)", "'index.md' does not contain an anchor '#no-such-heading'"),
        "docs/methods-reference.md": ("[p](methods/no-such-page.md)", "'methods/no-such-page.md'"),
        "docs/methods/una.md": ("[s](../../src/sentemb/no_such_file.py)", "'../../src/sentemb/no_such_file.py'"),
        "README.md": ("[c](docs/clusters.md#no-such-heading)", "'clusters.md' does not contain an anchor '#no-such-heading'"),
    }
    (root / "README.md").write_text((REPO / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    for rel, (link, _) in broken.items():
        with open(root / rel, "a", encoding="utf-8") as f:
            f.write(f"\n\nA broken link: {link}.\n")
    (root / "docs" / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")

    r = _build(root, tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"the strict build passed with broken links:\n{out}"
    for _, said in broken.values():
        assert said in out, f"mkdocs did not report {said}:\n{out}"
    assert "orphan.md" in out, out  # a page left out of the nav
    assert "Aborted with 5 warnings in strict mode" in out, out


def test_link_rewriting():
    h = _hooks()
    kw = dict(root=REPO, docs_prefix="docs")
    assert h.rewrite_link("docs/configuration.md#inputs", "index.md", **kw) == "configuration.md#inputs"
    assert h.rewrite_link("docs/methods/una.md", "index.md", **kw) == "methods/una.md"
    assert h.rewrite_link("config/README.md", "index.md", **kw) == "config-keys.md"
    assert h.rewrite_link("../README.md#methods", "configuration.md", **kw) == "index.md#methods"
    assert h.rewrite_link("../config/README.md", "configuration.md", **kw) == "config-keys.md"
    assert h.rewrite_link("../configuration.md#x", "methods/una.md", **kw) == "../configuration.md#x"
    assert h.rewrite_link("methods/", "method-interface.md", **kw) == "methods/index.md"
    assert h.rewrite_link("#anchor", "studies.md", **kw) == "#anchor"
    assert h.rewrite_link("https://example.org/a.md", "studies.md", **kw) == "https://example.org/a.md"
    # a source file outside docs/: its text alone, or a link to it on repo_url
    assert h.rewrite_link("../../src/sentemb/methods/una.py", "methods/una.md", **kw) is None
    assert (h.rewrite_link("../../src/sentemb/methods/una.py", "methods/una.md", **kw,
                           repo_url="https://github.com/o/sentemb/", branch="dev")
            == "https://github.com/o/sentemb/blob/dev/src/sentemb/methods/una.py")
    assert (h.rewrite_link("../../examples/methods/", "methods/una.md", **kw, repo_url="https://github.com/o/sentemb")
            == "https://github.com/o/sentemb/tree/main/examples/methods")
    # a missing target is left for mkdocs to report
    assert h.rewrite_link("../../src/no_such.py", "methods/una.md", **kw) == "../../src/no_such.py"


def test_github_lists():
    h = _hooks()
    assert h.gfm_lists("Text:\n- a\n- b\n") == "Text:\n\n- a\n- b\n"
    assert h.gfm_lists("- a\n  more\n  - b\n    more\n- c\n") == "- a\n  more\n    - b\n      more\n- c\n"
    assert h.gfm_lists("ArcCSE's\n512) and more\n") == "ArcCSE's\n512) and more\n"  # not a list in GitHub
    assert h.gfm_lists("```\nText:\n- a\n```\n") == "```\nText:\n- a\n```\n"  # code is left alone
