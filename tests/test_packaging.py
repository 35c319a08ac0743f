"""A built wheel carries what an installed sglang-spec needs: entry points, fixtures, patches, server configs.

``patches/`` and ``server_configs/`` live at the repository's top level; a wheel maps them into
``sglang_spec/data/`` and ``sglang_spec.paths.shipped_dir`` must find them there once installed.
The wheel is built from a copy of the sources (setuptools builds in-tree, and a stale ``build/``
from an earlier layout would end up in the wheel and hide a package missing from the config).
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "sglang_spec", "patches", "server_configs")


def test_wheel_ships_data_and_entry_points(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(REPO / name, src / name)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            str(src),
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    # The packaging configuration is complete: setuptools has nothing to warn about.
    log = build.stdout + build.stderr
    assert "BuildBackendWarning" not in log and "absent from the `packages`" not in log, log
    (wheel,) = (tmp_path / "dist").glob("sglang_spec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for init in (REPO / "sglang_spec").rglob("__init__.py"):  # every package, e.g. a new subpackage
        assert init.relative_to(REPO).as_posix() in names, init
    for pin in ("0.5.23", "0.5.22"):
        assert f"sglang_spec/data/patches/{pin}/manifest.json" in names
        assert f"sglang_spec/data/patches/{pin}/series" in names
    assert "sglang_spec/data/patches/support.json" in names  # `sglang-spec patch --list`
    configs = {p.name for p in (REPO / "server_configs").glob("*.yaml")}
    assert (
        configs
        and {n.rsplit("/", 1)[1] for n in names if n.startswith("sglang_spec/data/server_configs/")}
        >= configs
    )
    for part in ("hybrid", "hybrid-dflash", "qwen3", "qwen3-dflash"):
        assert f"sglang_spec/fixtures/tiny-pair/{part}/model.safetensors" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "[sglang.srt.plugins]" in text and "ddtree = sglang_spec.plugin:register" in text
    assert "sglang-spec = sglang_spec.cli:main" in text

    # Installed from the wheel (no checkout beside it), the data is found inside the package.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "from sglang_spec.paths import shipped_dir; import sglang_spec.serving.configs as c; "
        "print(shipped_dir('patches')); print(c.CONFIG_DIR); print(len(list(c.CONFIG_DIR.glob('*.yaml'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == str(site / "sglang_spec" / "data" / "patches")
    assert out[1] == str(site / "sglang_spec" / "data" / "server_configs") and int(out[2]) == len(
        configs
    )


# A device call carries at most 64 MiB: the tracked tree, the SGLang kit (23.3 MiB) and the compile
# cache (about 10.5 MiB, e2e/compile_cache.sh) must fit together, with a margin for the untracked
# files a checkout carries (benchmarks/results/e2e_h200/README.md).
TRACKED_LIMIT_MIB = 29


def test_the_tracked_tree_leaves_room_for_the_kit_and_the_compile_cache_in_a_device_call():
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    sizes = {
        f: (REPO / f.decode()).stat().st_size for f in listed if f and (REPO / f.decode()).is_file()
    }
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= TRACKED_LIMIT_MIB * 2**20, (
        f"the tracked files are {total / 2**20:.1f} MiB, over {TRACKED_LIMIT_MIB} MiB: store raw "
        f"results as FILE.xz (largest: {[f.decode() for f in largest]})"
    )


def _save_cache(tmp_path, checkout_bytes: int, cache_bytes: int) -> tuple[str, bool]:
    """e2e/compile_cache.sh save in a copy of the script inside a git checkout carrying
    ``checkout_bytes`` (half tracked, half untracked and not ignored, the kit counted apart), with
    30 MiB each in .git, .compile-cache, __pycache__ and the build/ that `pip install .` leaves, which
    no call carries, and a Triton cache that packs to about ``cache_bytes`` (random bytes: xz cannot
    shrink them)."""
    root = tmp_path / "repo"
    (root / "e2e").mkdir(parents=True)
    shutil.copy(REPO / "e2e" / "compile_cache.sh", root / "e2e")
    (root / ".gitignore").write_text("/.compile-cache/\n__pycache__/\nbuild/\n/.gpu-kit/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    quarter = checkout_bytes // 4
    (root / "tracked").write_bytes(b"x" * quarter * 2)
    subprocess.run(["git", "add", "tracked"], cwd=root, check=True)
    (root / "untracked").write_bytes(b"x" * quarter)
    (root / ".gpu-kit").mkdir()
    (root / ".gpu-kit" / "site.tar.xz").write_bytes(b"x" * quarter)
    (root / ".git" / "big").write_bytes(b"x" * 30 * 2**20)
    for ignored in (".compile-cache", "__pycache__", "build"):
        (root / ignored).mkdir()
        (root / ignored / "big").write_bytes(b"x" * 30 * 2**20)
    triton = tmp_path / "triton"
    triton.mkdir()
    (triton / "kernel.bin").write_bytes(os.urandom(cache_bytes))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TRITON_CACHE_DIR=str(triton), SGLANG_JIT_CACHE_DIR=str(tmp_path / "no"))
    proc = subprocess.run(
        ["bash", str(root / "e2e" / "compile_cache.sh"), "save", str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout, (out / "compile-cache.tar.xz").exists()


def test_a_compile_cache_is_saved_only_if_the_next_call_can_carry_it(tmp_path):
    """The next call carries this checkout (kit included) and the cache: above 64 MiB in all the
    cache is not kept, and never above 15 MiB, what one file can come back as."""
    said, kept = _save_cache(tmp_path / "a", checkout_bytes=40 * 2**20, cache_bytes=2 * 2**20)
    assert kept and "compile_cache: saved" in said
    said, kept = _save_cache(tmp_path / "b", checkout_bytes=58 * 2**20, cache_bytes=6 * 2**20)
    assert not kept and "what a call carries beside this" in said and "not saved" in said
