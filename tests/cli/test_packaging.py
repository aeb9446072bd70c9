"""Packaging: the emulator installs under one namespace, so other distributions' `fabric`, `ranks` or
`launch` (e.g. the SSH library `fabric`) cannot shadow it."""

import os
import sys

from cli_helpers import ROOT, command, run, script


def test_a_package_named_fabric_beside_ours_shadows_nothing(tmp_path):
    for name in ("fabric", "ranks", "launch"):  # what `pip install fabric` (and friends) would put on the path
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the other {name} was imported')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    probe = run([sys.executable, "-c", "import nvlink_emu.fabric as f, importlib.util as u; "
                 "print(f.preset('dgx-h100').gpus, u.find_spec('fabric').origin)"], env=env, cwd=tmp_path)[0]
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["8", str(tmp_path / "fabric" / "__init__.py")]  # the other `fabric` is there
    done, _ = run([command("nvlink-emu"), "run", str(ROOT / "launch" / "examples" / "put_ring.py"), "--gpus", "2"],
                  env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "gpu1<->sw0" in done.stderr


def test_workload_scripts_get_errors_config_and_presets_from_one_import():
    import nvlink_emu.fabric as public
    from nvlink_emu.fabric import config, errors

    for name in ("FabricError", "ConfigError", "AccessViolation", "OutOfMemory", "UnsupportedOperation",
                 "CollectiveMismatch", "FabricTimeout", "ProtocolError", "ResourceExhausted"):
        assert getattr(public, name) is getattr(errors, name)
    assert public.preset is config.preset and public.PRESETS is config.PRESETS and public.load_toml is config.load_toml


def test_a_users_own_fabric_beside_the_workload_is_the_one_it_imports(tmp_path):
    # run from the repo's root (cli_helpers.run's cwd), whose fabric/, ranks/ and launch/ folders are the
    # emulator's: `nvlink-emu run` must neither put them on PYTHONPATH nor leave the root on sys.path
    user = tmp_path / "fabric"
    user.mkdir()
    (user / "__init__.py").write_text("WHOSE = 'the user'\nclass FabricError(Exception):\n    pass\n")
    body = ("import importlib.util, fabric\n"
            "import nvlink_emu.fabric.errors as ours\n"
            "def main(gpu):\n"
            "    others = [n for n in ('ranks', 'launch') if importlib.util.find_spec(n) is not None]\n"
            "    print(fabric.WHOSE, fabric.__file__, fabric.FabricError is ours.FabricError, others)\n")
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), "--gpus", "2", "--no-label"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"the user {user / '__init__.py'} False []"] * 2
