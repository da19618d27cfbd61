"""MkDocs hooks for the sentemb site (mkdocs.yml `hooks:`).

The Markdown is written for GitHub, where every relative link resolves against the repository. The
site is built from docs/ only, so these hooks

- add pages generated from files outside docs/, without copying them into the repository:
  index.md from README.md, config-keys.md from config/README.md, and methods/index.md, a list of
  the method pages (on GitHub, a link to `methods/` shows that folder);
- rewrite each relative link as the repository path it names on GitHub, then as that path in the
  site: README.md's `docs/x.md` -> `x.md`, a docs page's `../README.md#methods` -> `index.md#methods`,
  `../config/README.md` -> `config-keys.md`, `methods/` -> `methods/index.md`;
- turn a link to a file outside docs/ (`../../src/sentemb/methods/una.py`) into a link to that file
  on `repo_url` when mkdocs.yml sets one (branch `extra.source_branch`, default main), else into its
  text alone (the path in a code span, as the pages write it). A link to a file that does not exist
  is left as it is, for mkdocs to report.

MkDocs then validates every link and anchor as usual (`mkdocs build --strict` fails on any broken one).
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit
from xml.etree import ElementTree as etree

import markdown
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.sentemb")

# Site pages generated from files outside docs/: site path -> repository path.
OUTSIDE_PAGES = {"index.md": "README.md", "config-keys.md": "config/README.md"}
METHODS_INDEX = "methods/index.md"

_rendering: dict[str, Page | None] = {"page": None}  # pages are rendered one at a time


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _docs_prefix(config: MkDocsConfig) -> str:
    """docs_dir as a repository path ("docs")."""
    return Path(config.docs_dir).resolve().relative_to(_root(config)).as_posix()


def origin_of(src_uri: str, docs_prefix: str) -> str:
    """The repository path of the Markdown file behind a site page."""
    return OUTSIDE_PAGES.get(src_uri) or posixpath.join(docs_prefix, src_uri)


def rewrite_link(url: str, src_uri: str, *, root: Path, docs_prefix: str = "docs",
                 repo_url: str | None = None, branch: str = "main") -> str | None:
    """The site link for `url`, written in the page that the site serves as `src_uri`.

    Returns `url` itself where there is nothing to rewrite (external, absolute, anchor-only, or a
    target that does not exist: mkdocs reports it), and None where the link should become plain text
    (a file outside docs/ and no `repo_url`).
    """
    scheme, netloc, path, query, fragment = urlsplit(url)
    if scheme or netloc or not path or url.startswith(("/", "\\")):
        return url
    origin = origin_of(src_uri, docs_prefix)
    target = posixpath.normpath(posixpath.join(posixpath.dirname(origin), unquote(path)))
    if target == ".." or target.startswith("../") or not (root / target).exists():
        return url
    is_dir = (root / target).is_dir()
    site_pages = {repo: site for site, repo in OUTSIDE_PAGES.items()}
    if target in site_pages:
        site = site_pages[target]
    elif target == docs_prefix or target.startswith(docs_prefix + "/"):
        site = posixpath.relpath(target, docs_prefix)
        if is_dir:  # a folder: its index page
            site = posixpath.normpath(posixpath.join(site, "index.md"))
    elif repo_url:
        kind = "tree" if is_dir else "blob"
        return f"{repo_url.rstrip('/')}/{kind}/{branch}/{target}" + (f"#{fragment}" if fragment else "")
    else:
        return None
    rel = posixpath.relpath(site, posixpath.dirname(src_uri) or ".")
    return urlunsplit(("", "", rel, query, fragment))


class _LinkRewriter(markdown.treeprocessors.Treeprocessor):
    def __init__(self, md: markdown.Markdown, config: MkDocsConfig) -> None:
        super().__init__(md)
        self.config = config

    def run(self, root: etree.Element) -> None:
        page = _rendering["page"]
        if page is None:
            return
        kwargs = dict(root=_root(self.config), docs_prefix=_docs_prefix(self.config),
                      repo_url=self.config.repo_url,
                      branch=(self.config.extra or {}).get("source_branch", "main"))
        for el in root.iter():
            key = {"a": "href", "img": "src"}.get(el.tag)
            if key is None or el.get(key) is None:
                continue
            new = rewrite_link(el.get(key), page.file.src_uri, **kwargs)
            if new is not None:
                el.set(key, new)
            elif el.tag == "a":  # keep the link's text (a code span naming the file), drop the link
                el.tag = "span"
                el.attrib.clear()
                el.set("class", "repo-path")


class _LinkRewriterExtension(markdown.Extension):
    def __init__(self, config: MkDocsConfig) -> None:
        super().__init__()
        self.config = config

    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802 (Markdown's API)
        # after toc (5), before mkdocs' own link check and rewrite ("relpath", 0)
        md.treeprocessors.register(_LinkRewriter(md, self.config), "sentemb_links", 2)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(_LinkRewriterExtension(config))
    return config


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def _nav_paths(nav) -> list[str]:
    """Every page path in mkdocs.yml's nav, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_paths(v)]
    if isinstance(nav, list):
        return [p for v in nav for p in _nav_paths(v)]
    return []


def methods_index(config: MkDocsConfig, files: Files) -> str:
    """methods/index.md: the method pages, in the nav's order."""
    pages = [f.src_uri for f in files.documentation_pages()
             if f.src_uri.startswith("methods/") and f.src_uri != METHODS_INDEX]
    order = {p: i for i, p in enumerate(_nav_paths(config.nav))}
    pages.sort(key=lambda p: (order.get(p, len(order)), p))
    items = "\n".join(f"- [{_title(Path(config.docs_dir) / p)}]({posixpath.basename(p)})" for p in pages)
    return ("# Methods\n\nOne page per method (which paper each implements: [Methods](../index.md#methods)),"
            " and how to write your own:\n\n" + items + "\n")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    for site, repo in OUTSIDE_PAGES.items():
        if files.get_file_from_path(site) is not None:
            log.warning("docs/%s would hide %s, which the site serves as %s", site, repo, site)
            continue
        files.append(File.generated(config, site, abs_src_path=str(root / repo)))
    if files.get_file_from_path(METHODS_INDEX) is None:
        files.append(File.generated(config, METHODS_INDEX, content=methods_index(config, files)))
    return files


_LIST_ITEM = re.compile(r"^( *)([-*+]|\d{1,9}[.)])( +)\S")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def gfm_lists(text: str) -> str:
    """GitHub's lists for Python-Markdown, outside fenced code.

    - A blank line before a list that directly follows a paragraph line: GitHub starts a list
      there, Python-Markdown would fold the items into the paragraph.
    - A nested list indented as GitHub nests it (under the parent item's text, 2 spaces after `- `)
      is indented by 4 spaces a level, as Python-Markdown nests it; so are its indented lines.
    """
    out: list[str] = []
    fence = None
    items: list[tuple[int, int]] = []  # open list items: (column of their text, spaces added)
    prev_blank = True
    for line in text.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, items = m.group(1), []
        elif fence is not None:
            if m and m.group(1) == fence:
                fence = None
        elif not line.strip():
            prev_blank = True
            out.append(line)
            continue
        else:
            indent = len(line) - len(line.lstrip(" "))
            item = _LIST_ITEM.match(line)
            in_list = bool(items)
            if item and not in_list and not prev_blank and item.group(2)[:-1] not in ("", "1"):
                item = None  # only `1.` starts an ordered list inside a paragraph ("... ArcCSE's\n512) and")
            if item or prev_blank:  # a lazy continuation line stays in its item
                while items and indent < items[-1][0]:
                    items.pop()
            if item:
                if not in_list and not prev_blank and out and not out[-1].startswith((" ", "|", "#", ">")):
                    out.append("\n")
                added = 4 * len(items) - indent
                items.append((indent + len(item.group(2)) + len(item.group(3)), added))
                line = " " * (indent + added) + line[indent:]
            elif items and indent >= items[-1][0] and items[-1][1] > 0:
                line = " " * items[-1][1] + line
        prev_blank = False
        out.append(line)
    return "".join(out)


def on_page_markdown(markdown_text: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    _rendering["page"] = page
    return gfm_lists(markdown_text)
