from __future__ import annotations

import subprocess
import sys


def test_importing_the_plugin_imports_only_the_standard_library() -> None:
    code = (
        "import sys, trainer_plugin\n"
        "from trainer_plugin import Monitor\n"
        "import trainer_plugin.transports.http, trainer_plugin.transports.broker\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'celery', 'kombu', 'torch', 'redis', 'collectors', 'dashboard'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_disabled_monitor_in_a_script_exits_cleanly() -> None:
    code = (
        "from trainer_plugin import Monitor\n"
        "m = Monitor('llm', 'r')\n"
        "m.step(loss=1.0)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "Runwatch is disabled" in result.stderr
