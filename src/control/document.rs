//! Configuration documents: the text an operator writes (a file, an admin `POST` or `PATCH`),
//! and the rules that keep an empty, cut-short or careless one from changing what it does not
//! mention.
//!
//! * A document is TOML, or JSON when its first character is `{`.
//! * An empty document is refused ([`ControlError::Empty`]).
//! * A document that leaves out a top-level key the running configuration sets (a section
//!   such as `[fifo]` or `[admin]`, or `mode`, `body_limit`) is refused, naming the key:
//!   a file cut short, or written in several steps, must not quietly reset the limits it lost.
//!   A top-level `replace = true` says the omission is meant: the document then replaces the
//!   whole configuration, left-out keys taking their defaults.
//! * A patch ([`merge_patch`]) is merged into the running configuration (JSON merge patch,
//!   RFC 7386: objects merge key by key, `null` resets a key to its default, anything else
//!   replaces), so it changes exactly what it names.

use serde_json::{Map, Value};

use super::Config;
use crate::error::{ConfigError, ControlError};

/// A parsed replacement document: the configuration it describes and the top-level keys it
/// names.
#[derive(Debug)]
pub(crate) struct Document {
    pub(crate) config: Config,
    keys: Vec<String>,
    replace: bool,
}

fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

impl Document {
    /// Parses a TOML or JSON document (not validated yet).
    pub(crate) fn parse(text: &str) -> Result<Document, ControlError> {
        if is_json(text) {
            let mut map: Map<String, Value> = serde_json::from_str(text)?;
            let replace = match map.remove("replace") {
                None => false,
                Some(Value::Bool(b)) => b,
                Some(_) => return Err(not_a_bool().into()),
            };
            let keys = map.keys().cloned().collect();
            let config = Config::read(Value::Object(map))?;
            return Ok(Document {
                config,
                keys,
                replace,
            });
        }
        let mut table: toml::Table = toml::from_str(text)?;
        let (replace, config) = match table.remove("replace") {
            // Straight from the text: its errors say where.
            None => (false, Config::read(toml::Deserializer::parse(text)?)?),
            Some(toml::Value::Boolean(b)) => (b, Config::read(table.clone())?),
            Some(_) => return Err(not_a_bool().into()),
        };
        Ok(Document {
            config,
            keys: table.keys().cloned().collect(),
            replace,
        })
    }

    /// Refuses the document when it is empty, or when it leaves out a top-level key that
    /// `running` sets, unless it says `replace = true`. `[distributed]` and `[gateway]` are
    /// exempt: they cannot change while running, and a document without them keeps the
    /// running ones.
    pub(crate) fn check(&self, running: &Config) -> Result<(), ControlError> {
        if self.keys.is_empty() && !self.replace {
            return Err(ControlError::Empty);
        }
        if self.replace {
            return Ok(());
        }
        match running
            .sections()
            .into_iter()
            .filter(|s| *s != "distributed" && *s != "gateway")
            .find(|s| !self.keys.iter().any(|k| k == s))
        {
            Some(dropped) => Err(ConfigError::new(
                dropped,
                "the running configuration sets it and this document leaves it out \
                 (refused: write it, or add `replace = true` to reset it to its default)",
            )
            .into()),
            None => Ok(()),
        }
    }
}

/// The configuration a replacement document describes, checked against `running`.
pub(crate) fn replacement(running: &Config, text: &str) -> Result<Config, ControlError> {
    let document = Document::parse(text)?;
    document.check(running)?;
    Ok(document.config)
}

fn not_a_bool() -> ConfigError {
    ConfigError::new("replace", "must be true or false")
}

/// The running configuration with a partial document (TOML or JSON) merged into it. The
/// admin token, never written out, is kept unless the patch gives a new one.
pub(crate) fn merge_patch(running: &Config, text: &str) -> Result<Config, ControlError> {
    let patch: Value = if is_json(text) {
        serde_json::from_str(text)?
    } else {
        serde_json::to_value(toml::from_str::<toml::Table>(text)?)?
    };
    if patch.as_object().is_none_or(Map::is_empty) {
        return Err(ControlError::Empty);
    }
    let mut value = serde_json::to_value(running)?;
    merge(&mut value, patch);
    let mut config = Config::read(value)?;
    if config.admin.token.is_none() {
        config.admin.token.clone_from(&running.admin.token);
    }
    Ok(config)
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(&key);
            } else {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Mode;
    use crate::valid::Fraction;

    fn example() -> Config {
        let text = include_str!("../../examples/stormgate.toml");
        Config::from_toml(text).unwrap()
    }

    #[test]
    fn the_running_configuration_survives_a_json_round_trip() {
        let mut config = example();
        config.admin.token = Some("t".into());
        let back = merge_patch(&config, r#"{"mode":"adaptive"}"#).unwrap();
        assert_eq!(back, config, "a patch changes only what it names");
    }

    #[test]
    fn a_patch_changes_what_it_names_and_null_resets() {
        let running = example();
        let patched = merge_patch(&running, "mode = \"fixed\"\n[budget]\nalpha = 0.4\n").unwrap();
        assert_eq!(patched.mode, Mode::Fixed);
        assert_eq!(patched.budget.alpha, Fraction::new(0.4).unwrap());
        assert_eq!(patched.budget.stable_budget, running.budget.stable_budget);
        assert_eq!(patched.fifo, running.fifo);
        let reset = merge_patch(&running, r#"{"fifo": null}"#).unwrap();
        assert_eq!(reset.fifo, Config::default().fifo);
        assert!(matches!(
            merge_patch(&running, "  "),
            Err(ControlError::Empty)
        ));
        // A value of the wrong type names its field.
        let err = merge_patch(&running, "[budget]\nalpha = \"x\"\n").unwrap_err();
        assert_eq!(err.config_error().unwrap().field, "budget.alpha", "{err}");
        assert!(matches!(
            merge_patch(&running, "{\"budget\": "),
            Err(ControlError::Json(_))
        ));
    }

    #[test]
    fn an_empty_or_cut_short_document_is_refused_unless_it_says_replace() {
        let running = example();
        let text = include_str!("../../examples/stormgate.toml");
        for empty in ["", "\n# only a comment\n", "{}"] {
            let doc = Document::parse(empty).unwrap();
            assert!(matches!(doc.check(&running), Err(ControlError::Empty)));
        }
        // Every prefix of the example that parses leaves out a section it sets, or is whole.
        let mut refused = 0;
        // Every line end, and every 13th byte (cuts inside lines, keys and values).
        let cuts = (1..text.len()).filter(|&i| {
            text.is_char_boundary(i) && (text.as_bytes()[i - 1] == b'\n' || i % 13 == 0)
        });
        for cut in cuts {
            let Ok(doc) = Document::parse(&text[..cut]) else {
                continue;
            };
            if doc.config == running {
                continue; // nothing lost (only trailing comments cut)
            }
            match doc.check(&running) {
                Err(ControlError::Invalid(e)) => {
                    assert!(running.sections().contains(&&*e.field), "{e}");
                    refused += 1;
                }
                Err(ControlError::Empty) => refused += 1,
                Err(e) => panic!("{e}"),
                Ok(()) => {
                    // The cut fell inside the last sections it names: what it changes is
                    // within keys it names (the debounce is the guard against those).
                    let lost = doc.config.differences(&running);
                    assert!(
                        lost.iter().all(|s| doc.keys.iter().any(|k| k == s)),
                        "{lost:?}"
                    );
                }
            }
        }
        assert!(refused > 100, "{refused}");
        let doc = Document::parse("replace = true\n").unwrap();
        doc.check(&running).unwrap();
        assert_eq!(doc.config, Config::default());
        assert!(matches!(
            Document::parse("replace = 1\n"),
            Err(ControlError::Invalid(e)) if e.field == "replace"
        ));
    }
}
