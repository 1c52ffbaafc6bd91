//! Reading the documents the commands are given (job and schedule specs), as JSON or YAML, from
//! a file or standard input.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

/// Reads a spec (a job, or a schedule: `T`) as JSON, or as YAML when it does not look like
/// JSON, and checks it decodes as a `T` here first, so a mistake is reported at its line and
/// column in the user's own file, with the field's path. The server still judges the rest
/// (dependencies, limits), naming fields by path.
pub(super) fn read_spec<T: serde::de::DeserializeOwned>(file: &Path) -> anyhow::Result<Value> {
    let text = read_text(file)?;
    let name = file.display();
    if looks_json(&text) {
        let de = &mut serde_json::Deserializer::from_str(&text);
        if let Err(e) = serde_path_to_error::deserialize::<_, T>(de) {
            bail!("{name}: {}", located(e.path(), e.inner()));
        }
        return Ok(serde_json::from_str(&text)?);
    }
    let de = serde_yaml::Deserializer::from_str(&text);
    if let Err(e) = serde_path_to_error::deserialize::<_, T>(de) {
        bail!("{name}: {}", located(e.path(), e.inner()));
    }
    yaml_to_json(&text)
}

fn read_text(file: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    if file == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the spec from standard input")?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
    }
    Ok(text)
}

fn looks_json(text: &str) -> bool {
    text.trim_start().starts_with(['{', '['])
}

fn yaml_to_json(text: &str) -> anyhow::Result<Value> {
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)?;
    serde_json::to_value(yaml).context("the YAML does not map to JSON (non-string keys?)")
}

/// A document as JSON (or YAML), its syntax checked but not its fields.
pub(super) fn read_document(file: &Path) -> anyhow::Result<Value> {
    let text = read_text(file)?;
    let name = file.display();
    let value = if looks_json(&text) {
        serde_json::from_str(&text).with_context(|| format!("{name} is not valid JSON"))?
    } else {
        yaml_to_json(&text).with_context(|| format!("{name} is not valid YAML"))?
    };
    Ok(value)
}

/// `field: message` for a spec that does not decode, or the message alone when the problem is
/// the document's syntax rather than one field.
pub(super) fn located(path: &serde_path_to_error::Path, message: &dyn std::fmt::Display) -> String {
    match path.to_string().as_str() {
        "." | "" => message.to_string(),
        field => format!("{field}: {message}"),
    }
}
