//! The command line: flags, their environment variables, and the help text.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const HELP: &str = "\
stormgate: the stormgate stack in front of any streamable-HTTP MCP server

usage: stormgate --upstream URL [--listen ADDR] [--config FILE] [--shutdown-grace-ms MS]
       stormgate [--config FILE] [--upstream URL] --print-config
       stormgate --check-config FILE

  --upstream URL          the upstream MCP endpoint, http://host:port/path
                          (env STORMGATE_UPSTREAM; or [gateway] upstream in the file)
  --listen ADDR           where to serve, host:port (env STORMGATE_LISTEN; default 127.0.0.1:4000)
  --config FILE           the TOML configuration, watched and reloaded on SIGHUP
                          (env STORMGATE_CONFIG; default: built-in defaults, no reloads)
  --shutdown-grace-ms MS  how long calls in flight may finish after SIGTERM/SIGINT
                          (env STORMGATE_SHUTDOWN_GRACE_MS; default 30000)
  --print-config          print the configuration in effect (the file's, the flags', and every
                          default) as TOML, and exit
  --check-config FILE     check a configuration file: exit 0 if it can run, else 2 with the reason
  -h, --help              this text
  -V, --version           the version

Serves /mcp (the upstream, behind the whole stack), /metrics (Prometheus), and /admin when the
configuration has an admin token. Logs go to stderr, filtered by RUST_LOG (default info).
";

pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:4000";

/// What to do, from the flags and the environment.
#[derive(Debug)]
pub(crate) enum Command {
    Help,
    Version,
    Run(Options),
    /// Print the configuration in effect for these options.
    Print(Options),
    /// Check one configuration file.
    Check(PathBuf),
}

#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) upstream: Option<String>,
    pub(crate) config: Option<PathBuf>,
    pub(crate) grace: Duration,
}

/// A command line that cannot run (exit code 2).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum UsageError {
    Unknown(String),
    MissingValue(&'static str),
    Invalid {
        flag: &'static str,
        value: String,
        why: &'static str,
    },
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::Unknown(arg) => write!(f, "unknown argument {arg:?}"),
            UsageError::MissingValue(flag) => write!(f, "{flag} needs a value"),
            UsageError::Invalid { flag, value, why } => write!(f, "{flag} {value:?}: {why}"),
        }
    }
}

impl std::error::Error for UsageError {}

const FLAGS: [(&str, &str); 4] = [
    ("--listen", "STORMGATE_LISTEN"),
    ("--upstream", "STORMGATE_UPSTREAM"),
    ("--config", "STORMGATE_CONFIG"),
    ("--shutdown-grace-ms", "STORMGATE_SHUTDOWN_GRACE_MS"),
];

/// Parses `args` (without the program name); `env` reads an environment variable.
pub(crate) fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, UsageError> {
    let mut values: [Option<String>; 4] = Default::default();
    let mut print = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--print-config" => {
                print = true;
                continue;
            }
            "--check-config" => {
                let file = args
                    .next()
                    .ok_or(UsageError::MissingValue("--check-config"))?;
                return Ok(Command::Check(PathBuf::from(file)));
            }
            _ => {}
        }
        if let Some(file) = arg.strip_prefix("--check-config=") {
            return Ok(Command::Check(PathBuf::from(file)));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        let Some(i) = FLAGS.iter().position(|(flag, _)| *flag == name) else {
            return Err(UsageError::Unknown(arg.chars().take(64).collect()));
        };
        let value = match inline {
            Some(v) => v,
            None => args.next().ok_or(UsageError::MissingValue(FLAGS[i].0))?,
        };
        values[i] = Some(value);
    }
    for (i, (_, var)) in FLAGS.iter().enumerate() {
        if values[i].is_none() {
            values[i] = env(var).filter(|v| !v.is_empty());
        }
    }
    let [listen, upstream, config, grace] = values;
    let listen = listen.unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let listen = listen.parse().map_err(|_| UsageError::Invalid {
        flag: "--listen",
        value: listen.chars().take(256).collect(),
        why: "not an address such as 127.0.0.1:4000",
    })?;
    let grace = match grace {
        None => stormgate::serve::DEFAULT_GRACE,
        Some(v) => Duration::from_millis(v.parse().map_err(|_| UsageError::Invalid {
            flag: "--shutdown-grace-ms",
            value: v.chars().take(64).collect(),
            why: "not a number of milliseconds",
        })?),
    };
    let options = Options {
        listen,
        upstream,
        config: config.map(PathBuf::from),
        grace,
    };
    Ok(if print {
        Command::Print(options)
    } else {
        Command::Run(options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Command, UsageError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        parse(args.iter().map(|a| (*a).to_owned()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn flags_win_over_the_environment() {
        let Ok(Command::Run(o)) = run(
            &["--listen=127.0.0.1:5000", "--upstream", "http://a/mcp"],
            &[
                ("STORMGATE_LISTEN", "127.0.0.1:6000"),
                ("STORMGATE_CONFIG", "x.toml"),
            ],
        ) else {
            panic!()
        };
        assert_eq!(o.listen.port(), 5000);
        assert_eq!(o.upstream.as_deref(), Some("http://a/mcp"));
        assert_eq!(o.config, Some(PathBuf::from("x.toml")));
        assert_eq!(o.grace, stormgate::serve::DEFAULT_GRACE);
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            run(&["--bogus"], &[]).unwrap_err(),
            UsageError::Unknown("--bogus".into())
        );
        assert_eq!(
            run(&["--upstream"], &[]).unwrap_err(),
            UsageError::MissingValue("--upstream")
        );
        assert!(matches!(
            run(&["--listen", "nowhere"], &[]),
            Err(UsageError::Invalid {
                flag: "--listen",
                ..
            })
        ));
        assert!(matches!(run(&["-h"], &[]), Ok(Command::Help)));
        assert_eq!(
            run(&["--check-config"], &[]).unwrap_err(),
            UsageError::MissingValue("--check-config")
        );
    }

    #[test]
    fn print_and_check_are_commands() {
        let Ok(Command::Print(o)) = run(&["--config", "g.toml", "--print-config"], &[]) else {
            panic!()
        };
        assert_eq!(o.config, Some(PathBuf::from("g.toml")));
        for args in [
            &["--check-config", "g.toml"][..],
            &["--check-config=g.toml"],
        ] {
            let Ok(Command::Check(file)) = run(args, &[]) else {
                panic!("{args:?}")
            };
            assert_eq!(file, PathBuf::from("g.toml"));
        }
    }
}
