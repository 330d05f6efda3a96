//! Reloading the configuration when its file changes.

use std::path::PathBuf;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};

use super::{Control, Source};
use crate::error::ControlError;

/// How long a file must stay unchanged (no event) before it is read: editors and deploy
/// tools write a file in several steps, and a half-written file must not be applied.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

impl Control {
    /// Reloads `path` whenever it changes and then stays unchanged for [`DEBOUNCE`], until the
    /// returned task is aborted. The file goes through
    /// [`reload_document`](Control::reload_document): an invalid, empty or cut-short file is
    /// refused like any invalid reload (kept in [`Control::last_error`], counted, logged), and
    /// the running configuration stays.
    pub fn watch_file(&self, path: PathBuf) -> Result<tokio::task::JoinHandle<()>, ControlError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
        let name = path.file_name().map(|n| n.to_owned());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                let ours = event
                    .paths
                    .iter()
                    .any(|p| p.file_name().map(|n| n.to_owned()) == name);
                if ours && matches!(event.kind, EventKind::Modify(_) | EventKind::Create(_)) {
                    let _ = tx.try_send(());
                }
            })
            .map_err(|source| ControlError::Watch {
                path: path.clone(),
                source,
            })?;
        // The directory, not the file: editors often replace a file by renaming a new one.
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| ControlError::Watch {
                path: dir.clone(),
                source,
            })?;
        let control = self.clone();
        Ok(tokio::spawn(async move {
            let _watcher = watcher; // watching as long as the task lives
            while rx.recv().await.is_some() {
                // Quiet for a whole window: a writer still at work sends more events.
                loop {
                    tokio::time::sleep(DEBOUNCE).await;
                    if rx.try_recv().is_err() {
                        break;
                    }
                    while rx.try_recv().is_ok() {}
                }
                let _ = control.reload_path(&path, Source::File);
            }
        }))
    }
}
