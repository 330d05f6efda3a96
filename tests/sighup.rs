//! SIGHUP reloads the configuration file. One test in this binary: the signal is process-wide.

#![cfg(unix)]

use std::time::Duration;

use stormgate::control::{Config, Control, Mode};

#[tokio::test]
async fn sighup_reloads_the_file() {
    let dir = std::env::temp_dir().join(format!("stormgate-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stormgate.toml");
    std::fs::write(&path, "mode = \"adaptive\"\n").unwrap();
    let control = Control::new(Config::load(&path).unwrap()).unwrap();
    let hup = control.reload_on_sighup(path.clone()).unwrap();

    std::fs::write(&path, "mode = \"off\"\n").unwrap();
    assert_eq!(
        control.policy().mode,
        Mode::Adaptive,
        "no reload without the signal"
    );
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // A bounded wait for the signal's delivery: gives up after 5 s.
    for _ in 0..100 {
        if control.policy().mode == Mode::Off {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(control.policy().mode, Mode::Off);
    hup.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}
