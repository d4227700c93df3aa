"""The documentation stays true to the code (issue 42): the reference pages are what
docs/generate.py makes of the code now; each thing the code holds (a setting, a `vkprovider.io/`
key, a metric, a reason, a CLI flag) is on its page, found here independently of the generator;
the site builds with MkDocs, strictly; the README stays a short front door."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_generate"] = module
    spec.loader.exec_module(module)
    return module


generate = _generator()


@functools.cache
def _wanted() -> dict[str, str]:
    pages: dict[str, str] = generate.pages()
    return pages


def _sources() -> str:
    return "\n".join(p.read_text() for d in ("vkprovider", "federation") for p in sorted((ROOT / d).rglob("*.py")))


@pytest.mark.parametrize("page", ["settings.md", "membercluster.md", "keys.md", "metrics.md", "events.md", "cli.md"])
def test_each_reference_page_is_what_the_code_makes_of_it(page: str) -> None:
    wanted = _wanted()[page]
    assert (REFERENCE / page).read_text() == wanted, f"docs/reference/{page} is stale: run python docs/generate.py"


def _setting_keys(model: type[BaseModel], prefix: str) -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            keys += _setting_keys(nested, key + ".")
        else:
            keys.append(key)
    return keys


def test_every_setting_is_on_the_settings_page() -> None:
    from federation.config import FederationConfig
    from vkprovider.settings import Settings

    page = (REFERENCE / "settings.md").read_text()
    keys = _setting_keys(Settings, "") + _setting_keys(FederationConfig, "provider.federation.")
    missing = [k for k in keys if f"`{k}`" not in page]
    assert not missing, missing


def test_every_vkprovider_key_in_the_code_is_on_a_reference_page() -> None:
    pages = (REFERENCE / "keys.md").read_text() + (REFERENCE / "events.md").read_text()
    found = set(re.findall(r"""["']((?:[a-z0-9-]+\.)?vkprovider\.io/[A-Za-z0-9._-]+)["']""", _sources()))
    found -= {"vkprovider.io/v1alpha1"}  # the API group's version
    missing = sorted(k for k in found if f"`{k}`" not in pages and f"`{k}*`" not in pages)
    assert not missing, missing


def test_every_metric_in_the_code_is_on_the_metrics_page() -> None:
    page = (REFERENCE / "metrics.md").read_text()
    found = set(re.findall(r"""["'](vkprovider_[a-z0-9_]+)["']""", _sources()))
    missing = sorted(m for m in found if f"`{m}`" not in page and f"`{m}_total`" not in page)
    assert not missing, missing


def test_every_flag_of_both_commands_is_on_the_cli_page() -> None:
    import argparse

    from federation import cli as federation_cli
    from vkprovider import cli as vkprovider_cli

    page = (REFERENCE / "cli.md").read_text()

    def flags(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, str]]:
        out = [(prog, o) for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out += flags(sub, f"{prog} {name}")
        return out

    found = flags(vkprovider_cli._parser(), "vkprovider") + flags(federation_cli._parser(), "federation")
    assert len(found) > 40
    for prog, flag in found:
        section = page[page.index(f"### `{prog}`") :]
        section = section[: section.find("\n### ", 1)] if "\n### " in section[1:] else section
        assert f"`{flag}`" in section, (prog, flag)


def test_the_generation_refuses_a_key_without_its_comment_and_a_reason_it_cannot_explain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    undocumented = generate.Constant("vkprovider.io/new-thing", "NEW_THING", "federation/labels.py", "")
    monkeypatch.setattr(generate, "_string_constants", lambda: ([undocumented], []))
    with pytest.raises(generate.GenerationError, match="NEW_THING"):
        generate.keys_page()
    monkeypatch.setattr(generate, "written_reasons", lambda: {"SomethingNew": {"federation/x.py:1"}})
    with pytest.raises(generate.GenerationError, match="SomethingNew"):
        generate.events_page()


def test_the_reasons_found_in_the_code_include_the_kinds_a_user_meets() -> None:
    """The scan finds reasons wherever the code writes them (Events, pod statuses, conditions),
    so a new one cannot slip past docs/reasons.yaml unnoticed."""
    found = generate.written_reasons()
    for reason in ("NoMemberFits", "GangTimeout", "ReclaimNotice", "MemberLost", "Reclaimed", "FailedMount"):
        assert reason in found, reason
    assert "vkprovider.io/MemberReachable" in found


def test_the_site_builds_strictly_without_a_warning(tmp_path: Path) -> None:
    env: dict[str, Any] = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").is_file()


def test_the_readme_is_a_short_front_door_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", readme) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes in the README: {hashes}"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "docs" / "examples").glob("*.yaml")))
def test_each_example_is_yaml_kubectl_can_read_document_by_document(name: str) -> None:
    """kubectl reads a multi-document file one document at a time, so an anchor in one document
    is undefined in the next (found by CI: the lab test failed where a reader's apply would).
    Each document stands alone and names its kind."""
    import yaml

    text = (ROOT / "docs" / "examples" / name).read_text()
    for part in re.split(r"^---$", text, flags=re.M):
        doc = yaml.safe_load(part)
        if doc is None:
            continue
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), (name, doc)
