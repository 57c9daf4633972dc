"""The one-line error contract of every entry point."""
import subprocess
import sys
import textwrap


def run_cli(body: str, *args: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        from common.errors import CSRunError, cli_entry

        @cli_entry("prog")
        def main():
        {textwrap.indent(textwrap.dedent(body), '    ')}

        main()
    """)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


def test_user_error_is_one_line_and_exit_1():
    proc = run_cli('raise CSRunError("params file x.yaml not found", "pass -p PATH")')
    assert proc.returncode == 1
    assert proc.stderr == "prog: error: params file x.yaml not found (hint: pass -p PATH)\n"
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    proc = run_cli('raise CSRunError("boom")', "--debug")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "CSRunError: boom" in proc.stderr


def test_internal_bugs_are_not_hidden():
    proc = run_cli("raise RuntimeError('bug')")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "RuntimeError: bug" in proc.stderr
