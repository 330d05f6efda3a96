//! The command line: flags, their environment variables, and the help text.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::num::NonZeroUsize;
use stormgate::serve::Connections;
use stormgate::valid::NonZeroDuration;

pub(crate) const HELP: &str = "\
stormgate: the stormgate stack in front of any streamable-HTTP MCP server

usage: stormgate --upstream URL [--listen ADDR] [--config FILE] [--shutdown-grace-ms MS]
                 [--header-timeout-ms MS] [--max-connections N]
       stormgate [--config FILE] [--upstream URL] --print-config
       stormgate --check-config FILE

  --upstream URL          the upstream MCP endpoint, http://host:port/path
                          (env STORMGATE_UPSTREAM; or [gateway] upstream in the file)
  --listen ADDR           where to serve, host:port (env STORMGATE_LISTEN; default 127.0.0.1:4000)
  --config FILE           the TOML configuration, watched and reloaded on SIGHUP
                          (env STORMGATE_CONFIG; default: built-in defaults, no reloads)
  --shutdown-grace-ms MS  how long calls in flight may finish after SIGTERM/SIGINT
                          (env STORMGATE_SHUTDOWN_GRACE_MS; default 30000)
  --header-timeout-ms MS  a connection without a whole request head this long after it opens,
                          or after its last answer, is closed (idle and slow clients)
                          (env STORMGATE_HEADER_TIMEOUT_MS; default 30000)
  --max-connections N     connections open at once; past it none is accepted until one closes
                          (env STORMGATE_MAX_CONNECTIONS; default 10000)
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
    pub(crate) connections: Connections,
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

const FLAGS: [(&str, &str); 6] = [
    ("--listen", "STORMGATE_LISTEN"),
    ("--upstream", "STORMGATE_UPSTREAM"),
    ("--config", "STORMGATE_CONFIG"),
    ("--shutdown-grace-ms", "STORMGATE_SHUTDOWN_GRACE_MS"),
    ("--header-timeout-ms", "STORMGATE_HEADER_TIMEOUT_MS"),
    ("--max-connections", "STORMGATE_MAX_CONNECTIONS"),
];

/// Parses `args` (without the program name); `env` reads an environment variable.
pub(crate) fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, UsageError> {
    let mut values: [Option<String>; 6] = Default::default();
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
    let [
        listen,
        upstream,
        config,
        grace,
        header_timeout,
        max_connections,
    ] = values;
    let listen = listen.unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let listen = listen.parse().map_err(|_| UsageError::Invalid {
        flag: "--listen",
        value: listen.chars().take(256).collect(),
        why: "not an address such as 127.0.0.1:4000",
    })?;
    let grace = match grace {
        None => stormgate::serve::DEFAULT_GRACE,
        Some(v) => Duration::from_millis(number("--shutdown-grace-ms", &v, 0)?),
    };
    let mut connections = Connections::default();
    if let Some(v) = header_timeout {
        let ms = number("--header-timeout-ms", &v, 1)?;
        connections = connections
            .header_timeout(NonZeroDuration::from_millis(ms).expect("a number of at least 1"));
    }
    if let Some(v) = max_connections {
        let n = number("--max-connections", &v, 1)?;
        let n = NonZeroUsize::new(usize::try_from(n).unwrap_or(usize::MAX));
        connections = connections.max_connections(n.expect("a number of at least 1"));
    }
    let options = Options {
        listen,
        upstream,
        config: config.map(PathBuf::from),
        grace,
        connections,
    };
    Ok(if print {
        Command::Print(options)
    } else {
        Command::Run(options)
    })
}

/// The value of `flag` as a whole number of at least `min`.
fn number(flag: &'static str, value: &str, min: u64) -> Result<u64, UsageError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&n| n >= min)
        .ok_or_else(|| UsageError::Invalid {
            flag,
            value: value.chars().take(64).collect(),
            why: if min == 0 {
                "not a whole number"
            } else {
                "not a whole number of at least 1"
            },
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
        assert_eq!(o.connections, Connections::default());
        let Ok(Command::Run(o)) = run(
            &["--max-connections", "500"],
            &[("STORMGATE_HEADER_TIMEOUT_MS", "5000")],
        ) else {
            panic!()
        };
        assert_eq!(o.connections.max_connections.get(), 500);
        assert_eq!(o.connections.header_timeout.get(), Duration::from_secs(5));
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
        for (flag, value) in [
            ("--max-connections", "0"),
            ("--header-timeout-ms", "0"),
            ("--header-timeout-ms", "soon"),
            ("--shutdown-grace-ms", "-1"),
        ] {
            assert!(
                matches!(run(&[flag, value], &[]), Err(UsageError::Invalid { flag: f, .. }) if f == flag),
                "{flag} {value}"
            );
        }
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
