//! The simulated daemons' state directories. The simulation is built into
//! the library for `picket-sim`, so the two calls it makes of the tempfile
//! crate (a test-only dependency) are these few lines instead; the module's
//! name shadows the crate's in `scenario.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory removed when dropped.
#[derive(Debug)]
pub(super) struct TempDir(PathBuf);

impl TempDir {
    /// Where it is.
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort, as tempfile's: a leftover directory harms nothing.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the directories go: `PICKET_SIM_TMP`, else /dev/shm when there is
/// one, else the system's temporary directory. Every vote and epoch is
/// written and fsynced there, as the daemon does: on a disk, the fsyncs
/// were most of a schedule's time.
fn base() -> PathBuf {
    if let Some(dir) = std::env::var_os("PICKET_SIM_TMP") {
        return dir.into();
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// A new, empty directory under [`base`].
pub(super) fn tempdir() -> std::io::Result<TempDir> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = base();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("picket-sim-{}-{n}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(TempDir(path)),
            // Left by an earlier process with the same id: the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}
