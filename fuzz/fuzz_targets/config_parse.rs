//! `picket::config::load_str`: configuration text (and the path named in
//! messages) must never panic, whatever it holds; its errors must display;
//! and a configuration that loads must load again, equal, from its own
//! serialization (the daemon prints and compares configs on reload).
//!
//! Input: the first line is the path, the rest the text.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (path, text) = s.split_once('\n').unwrap_or(("picket.toml", s));
    match picket::config::load_str(Path::new(path), text) {
        Err(e) => {
            let shown = e.to_string();
            assert!(
                !e.problems().is_empty(),
                "an error without a problem: {shown}"
            );
            for p in e.problems() {
                if let Some(line) = p.line {
                    assert!(
                        line >= 1 && line <= text.lines().count().max(1) + 1,
                        "problem on line {line} of a {}-line text: {shown}",
                        text.lines().count()
                    );
                }
            }
        }
        Ok(config) => {
            let again = toml::to_string(&config)
                .unwrap_or_else(|e| panic!("a loaded config does not serialize: {e}"));
            let back = picket::config::load_str(Path::new(path), &again).unwrap_or_else(|e| {
                panic!("a loaded config re-serialized is refused: {e}\n{again}")
            });
            assert_eq!(
                back, config,
                "a config changed through its serialization:\n{again}"
            );
        }
    }
});
