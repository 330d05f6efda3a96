//! Reloading the configuration when its file changes.

use std::path::PathBuf;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};

use super::Control;

/// How long a burst of file events is let settle before the file is read (editors write a
/// file in several steps).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

impl Control {
    /// Reloads `path` whenever it changes (debounced by [`DEBOUNCE`]), until the returned task
    /// is aborted. An invalid file is refused like any invalid reload: the error is kept in
    /// [`Control::last_error`], counted, and the running configuration stays.
    pub fn watch_file(&self, path: PathBuf) -> Result<tokio::task::JoinHandle<()>, String> {
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
            .map_err(|e| e.to_string())?;
        // The directory, not the file: editors often replace a file by renaming a new one.
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let control = self.clone();
        Ok(tokio::spawn(async move {
            let _watcher = watcher; // watching as long as the task lives
            while rx.recv().await.is_some() {
                tokio::time::sleep(DEBOUNCE).await;
                while rx.try_recv().is_ok() {}
                let _ = control.reload_file(&path);
            }
        }))
    }
}
