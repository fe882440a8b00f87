"""The worker pool's folder is this user's alone (issue 54 item 1): the default pool lies in world-writable
/tmp and holds the GPU lock files and the worker groups' sockets. It is made private (0700), a folder another
user owns or may write, or a link in its place, is refused naming launcher.pool_dir, and a lock file planted
as a link is refused with its target untouched. Real folders, links, flocks and the Launcher."""
import os
import stat

import pytest

from conftest import base_config
from tptune.errors import TptuneError
from tptune.measure.gpupool import GpuPool, pool_folder
from tptune.measure.launch import Launcher
from tptune.measure.preflight import resolve_here
from tptune.measure.worker.lifeline import Busy, is_busy

USER = os.environ.get("USER") or str(os.getuid())


def _mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_the_launcher_makes_its_pool_folder_private(pool_dir):
    lz = Launcher(resolve_here(base_config(pool_dir)))
    assert lz.pool_dir == pool_dir / USER / "local"
    assert _mode(pool_dir / USER) == 0o700 and _mode(lz.pool_dir) == 0o700
    assert _mode(lz.pool.lock_dir) == 0o700


def test_an_existing_folder_of_ours_is_made_private(pool_dir):
    """A pool folder made by an earlier tptune (0755) is ours and nobody else's to write: kept, made 0700."""
    (pool_dir / USER / "local").mkdir(parents=True, mode=0o755)
    os.chmod(pool_dir / USER, 0o755)
    folder = pool_folder(str(pool_dir))
    assert _mode(pool_dir / USER) == 0o700 and _mode(folder) == 0o700


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_kept(pool_dir, tmp_path):
    """Before: the next run truncated the link's target and wrote its pid into it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    locks = pool_folder(str(pool_dir)) / "locks"
    locks.mkdir(mode=0o700)
    (locks / "gpu0.lock").symlink_to(victim)
    pool = GpuPool(locks, ["0"])
    with pytest.raises(TptuneError) as e:
        with pool.acquire(1, timeout=5):
            pass
    assert str(locks / "gpu0.lock") in str(e.value) and "symbolic link" in str(e.value)
    assert victim.read_text() == "precious\n"
    # a worker group's busy lock beside its socket likewise
    sock = pool_folder(str(pool_dir)) / "srv-0.sock"
    (pool_dir / USER / "local" / "srv-0.sock.busy").symlink_to(victim)
    assert is_busy(sock) is False
    with pytest.raises(TptuneError, match="symbolic link"):
        Busy(sock)
    assert victim.read_text() == "precious\n"


def test_a_folder_others_may_write_is_refused(pool_dir):
    (pool_dir / USER).mkdir()
    os.chmod(pool_dir / USER, 0o777)
    with pytest.raises(TptuneError) as e:
        pool_folder(str(pool_dir))
    msg = str(e.value)
    assert "launcher.pool_dir" in msg and str(pool_dir / USER) in msg and "0o777" in msg, msg
    assert _mode(pool_dir / USER) == 0o777       # refused, not repaired: something may be planted in it already


def test_a_link_in_place_of_the_users_folder_is_refused(pool_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (pool_dir / USER).symlink_to(elsewhere)
    with pytest.raises(TptuneError, match="symbolic link"):
        pool_folder(str(pool_dir))
    assert list(elsewhere.iterdir()) == []


def test_a_shared_pool_dir_needs_the_sticky_bit(pool_dir):
    """pool_dir itself may be shared, as /tmp is: writable by all only with the sticky bit (nobody may then
    rename or remove another user's folder in it)."""
    os.chmod(pool_dir, 0o777)
    with pytest.raises(TptuneError, match="sticky"):
        pool_folder(str(pool_dir))
    os.chmod(pool_dir, 0o1777)
    assert _mode(pool_folder(str(pool_dir)).parent) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_another_user_owns_is_refused(pool_dir):
    (pool_dir / USER).mkdir(mode=0o700)
    os.chown(pool_dir / USER, 65534, 65534)
    with pytest.raises(TptuneError, match=r"belongs to .*uid 65534"):
        pool_folder(str(pool_dir))
    os.chown(pool_dir / USER, 0, 0)
    os.chown(pool_dir, 65534, 65534)         # pool_dir itself: its owner could swap the user's folder
    with pytest.raises(TptuneError, match=r"belongs to .*uid 65534"):
        pool_folder(str(pool_dir))
