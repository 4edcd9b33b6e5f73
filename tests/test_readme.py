"""Every command and option the README shows exists: each `darknet-py <command> --option`
in its code (fenced blocks and inline code) is checked against that command's --help, so
the README cannot drift from the command line again."""

import re
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from darknet_py.cli import cli
from darknet_py.darknet_forms import DarknetFormError, translate

README = Path(__file__).resolve().parents[1] / "README.md"

# Commands other engineers are adding this session: the README may show them before they are
# merged. The lead empties this list once they are in cli.py.
COMMANDS_BEING_ADDED = set()


def readme_code():
    """The README's code: fenced blocks and inline code spans, with `\\` continuations
    joined."""
    text = README.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return [line for chunk in blocks + spans for line in chunk.replace("\\\n", " ").split("\n")]


def shown_commands():
    """{command: options shown with it} for every `darknet-py COMMAND ...` in the code. A
    command of a group (`rnn train`) is "rnn train"; Darknet's own forms (`detector train
    DATA CFG -map`) count as the command they are translated into (darknet_forms)."""
    shown = {}
    for line in readme_code():
        line = line.split("#", 1)[0]  # a shell comment is prose
        for match in re.finditer(r"darknet-py\s+([a-z][\w-]*)(.*?)(?=darknet-py|$)", line):
            command, rest = match.groups()
            words = rest.split()
            if command in ("detector", "classifier") or (command == "rnn" and "-file" in words):
                try:
                    translated, _ = translate([command] + [w for w in words if "..." not in w])
                except DarknetFormError:  # a mention of the form, not a command line
                    continue
                command, words = translated[0], translated[1:]
            if isinstance(cli.commands.get(command), click.Group) and words:
                command = f"{command} {words[0]}"
            options = {
                o.split("=")[0] for o in re.findall(r"(?<![\w-])--[a-z][\w-]*", " ".join(words))
            }
            shown.setdefault(command, set()).update(options)
    return shown


def test_the_readme_shows_the_main_commands():
    shown = shown_commands()
    for command in ("detect", "train", "map", "partial", "info", "bench"):
        assert command in shown, f"the README shows no `darknet-py {command}`"


@pytest.mark.parametrize("command", sorted(shown_commands()))
def test_every_command_and_option_the_readme_shows_exists(command):
    options = shown_commands()[command]
    if command in COMMANDS_BEING_ADDED and command not in cli.commands:
        pytest.skip(f"`darknet-py {command}` is being added on another branch")
    group, _, sub = command.partition(" ")
    assert group in cli.commands, f"README shows `darknet-py {group}`, which does not exist"
    if sub:
        assert sub in cli.commands[group].commands, f"README shows `darknet-py {command}`"
    result = CliRunner().invoke(cli, command.split() + ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    listed = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", result.output))
    missing = sorted(options - listed)
    assert not missing, f"README shows `darknet-py {command}` with {missing}, not in its --help"


def test_the_check_sees_a_wrong_option(monkeypatch, tmp_path):
    fake = tmp_path / "README.md"
    fake.write_text(
        "```sh\ndarknet-py detect CFG W IMG --thresh .5 \\\n  --no-such-flag\n```\n"
        "and `darknet-py map CFG D W --points 11`\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "README", fake)
    assert shown_commands() == {"detect": {"--thresh", "--no-such-flag"}, "map": {"--points"}}
