"""The man pages and --help cannot drift from the parsers: every subcommand and option
of src/ctdsfs/cli.py's argparse parsers, and every -o option mount.py accepts, is named
in man/; both --help texts name every format ctdsfs reads and point to the man pages."""

import argparse
import ast
import inspect
import re
import subprocess
from pathlib import Path

import pytest

from ctdsfs import __version__, cli, mount

MAN = Path(__file__).resolve().parent.parent / "man"


def _man_text(name):
    """The page's source with roff escapes and font changes undone (plain words left)."""
    text = (MAN / name).read_text()
    text = re.sub(r"\\f[BIRP]", "", text).replace("\\-", "-").replace("\\&", "")
    return text


def _sections(text):
    """The page cut at each ``.SS`` heading: {heading: body}."""
    parts = re.split(r"^\.SS (.*)$", text, flags=re.M)
    return {parts[i].strip('"'): parts[i + 1] for i in range(1, len(parts), 2)}


def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _option_strings(parser, shown_only=False):
    """Every option string a user may type (with ``shown_only``, not those --help hides:
    mount(8)'s, ignored, which mount.ctdsfs.8 names)."""
    return {s for a in parser._actions for s in a.option_strings
            if not (shown_only and a.help == argparse.SUPPRESS)}


def _mentions(text, word):
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None


def test_every_subcommand_and_its_options_are_in_ctdsfs_1():
    sections = _sections(_man_text("ctdsfs.1"))
    commands = _subparsers(cli._main_parser())
    assert set(commands) == set(cli.COMMANDS)
    for name, parser in commands.items():
        heading = next((h for h in sections if h.startswith(f"ctdsfs {name} ")), None)
        assert heading, f"ctdsfs.1 has no section for 'ctdsfs {name}'"
        missing = [s for s in _option_strings(parser, shown_only=True) - {"-h", "--help"}
                   if not _mentions(heading + sections[heading], s)]
        assert not missing, f"ctdsfs.1, section {name}: options {missing} missing"
    top = _man_text("ctdsfs.1")
    assert all(_mentions(top, s) for s in _option_strings(cli._main_parser()))


def _accepted_mount_options():
    """Every -o option parse_options accepts: the tables of mount.py, and each string
    parse_options compares an item with (each checked to be accepted, so the list is
    what the code takes, not what the source happens to contain)."""
    names = (mount.KERNEL_OPTIONS | mount.IGNORED_OPTIONS | mount.REMOTE_TEXT_OPTIONS
             | set(mount.REMOTE_NUMBER_OPTIONS))
    tree = ast.parse(inspect.getsource(mount.parse_options))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.rstrip("=")
            if re.fullmatch(r"[a-z_]+", word):
                names.add(word)
    accepted = set()
    for name in names:
        item = name if name not in mount.REMOTE_NUMBER_OPTIONS and name not in (
            "blocksize", "commit", "logfile", "timestamp", "workers") and name not in mount.REMOTE_TEXT_OPTIONS \
            else f"{name}=1"
        needed = mount.REQUIRES.get(name)
        try:
            mount.parse_options(",".join(filter(None, [item, needed])))
        except mount.UsageError as exc:
            assert "unknown mount option" not in str(exc), exc
            continue
        accepted.add(name)
    return accepted


def test_every_mount_option_is_in_mount_ctdsfs_8():
    text = _man_text("mount.ctdsfs.8")
    options = _accepted_mount_options()
    assert {"rw", "create", "blocksize", "allow_other", "cache_dir", "anon", "dirsync"} <= options
    missing = sorted(o for o in options if not _mentions(text, o))
    assert not missing, f"mount.ctdsfs.8 does not name the -o options {missing}"
    for prefix in mount.IGNORED_PREFIXES:
        assert prefix in text
    for string in _option_strings(cli._mount_parser("mount.ctdsfs")):
        assert _mentions(text, string), f"mount.ctdsfs.8 does not name {string}"


def test_the_check_fails_for_an_option_the_page_lacks(tmp_path, monkeypatch):
    """The drift check can fail: a parser option the page does not name is reported."""
    text = _man_text("ctdsfs.1")
    assert not _mentions(text, "--frobnicate")
    original = cli._main_parser

    def with_new_option():
        parser = original()
        _subparsers(parser)["info"].add_argument("--frobnicate", action="store_true")
        return parser

    monkeypatch.setattr(cli, "_main_parser", with_new_option)
    with pytest.raises(AssertionError, match="--frobnicate"):
        test_every_subcommand_and_its_options_are_in_ctdsfs_1()


@pytest.mark.parametrize("page", ["ctdsfs.1", "mount.ctdsfs.8"])
def test_man_page_renders_without_warnings(page):
    result = subprocess.run(["groff", "-ww", "-man", "-Tutf8", "-z", str(MAN / page)],
                            capture_output=True, text=True, check=True)
    assert result.stderr == ""
    assert f'"ctdsfs {__version__}"' in (MAN / page).read_text(), "version of the page"


FORMATS_NAMED = ["MultiFile", "versions 1", "2", "MultiHDF5", ".pycauset", "bcolz carray",
                 "ctable", "bloscpack", "TileDB", "s3://", "http(s)://"]


@pytest.mark.parametrize("parser, page", [
    (cli._main_parser(), "ctdsfs(1)"), (cli._mount_parser("mount.ctdsfs"), "mount.ctdsfs(8)")])
def test_help_names_every_format_and_the_man_page(parser, page):
    text = " ".join(parser.format_help().split())
    missing = [word for word in FORMATS_NAMED if word not in text]
    assert not missing, f"{parser.prog} --help does not name {missing}"
    assert page in text


def test_docs_name_every_mount_option_and_command():
    """docs/mounting.md lists every -o option, docs/toolbox.md every command and option."""
    docs = MAN.parent / "docs"
    mounting = (docs / "mounting.md").read_text()
    missing = sorted(o for o in _accepted_mount_options() if not _mentions(mounting, o))
    assert not missing, f"docs/mounting.md does not name the -o options {missing}"
    toolbox = (docs / "toolbox.md").read_text()
    for name, parser in _subparsers(cli._main_parser()).items():
        assert _mentions(toolbox, name), f"docs/toolbox.md does not name '{name}'"
        missing = [s for s in _option_strings(parser, shown_only=True) - {"-h", "--help"}
                   if not _mentions(toolbox, s)]
        assert not missing, f"docs/toolbox.md does not name {missing} of '{name}'"
