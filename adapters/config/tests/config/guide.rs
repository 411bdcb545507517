//! Every TOML example in `docs/configuration.md` is checked here: blocks
//! marked `toml` must be valid, a block marked `toml invalid` must fail with
//! exactly the errors of the `text` block that follows it.

use tollgate_config::Config;

const GUIDE: &str = include_str!("../../../../docs/configuration.md");

/// `(info string, body)` of every fenced block.
fn blocks() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = GUIDE.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            out.push((info.trim().to_string(), body.join("\n")));
        }
    }
    out
}

#[test]
fn valid_examples_parse() {
    let valid: Vec<String> = blocks()
        .into_iter()
        .filter(|(info, _)| info == "toml")
        .map(|(_, body)| body)
        .collect();
    assert!(valid.len() >= 3, "the guide lost its examples");
    for body in valid {
        match Config::from_toml_str(&body) {
            Ok(_) => {}
            // A build without the Redis store refuses a Redis example for
            // that alone, and says which feature to enable.
            #[cfg(not(feature = "redis"))]
            Err(e)
                if e.errors()
                    .iter()
                    .all(|e| e.to_string().contains("needs the Redis store")) => {}
            Err(e) => panic!("docs/configuration.md example does not parse:\n{body}\n\n{e}"),
        }
    }
}

#[test]
fn the_invalid_example_fails_exactly_as_shown() {
    let all = blocks();
    let at = all
        .iter()
        .position(|(info, _)| info == "toml invalid")
        .expect("the guide shows an invalid file");
    let (_, body) = &all[at];
    let (info, expected) = &all[at + 1];
    assert_eq!(info, "text", "the errors follow the invalid file");
    let err = Config::from_toml_str(body).expect_err("the example is invalid");
    let got: Vec<String> = err.errors().iter().map(ToString::to_string).collect();
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(got, expected);
}
