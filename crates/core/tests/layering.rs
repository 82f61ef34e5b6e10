//! core's basic modules (who is who, limits, encoding, crypto, configuration, quorums,
//! messages, the wire format, stage shape) must not import each other in a circle: each may
//! use only modules listed before it in `LAYERS`. Doc comments may link anywhere.

use std::path::Path;

/// Bottom first. A module may import (in code, not docs) only modules listed before it.
const LAYERS: &[&str] = &[
    "ids",
    "limits",
    "codec",
    "quorum",
    "config",
    "crypto",
    "reconfig",
    "page_tree",
    "pages",
    "service",
    "message",
    "stage",
    "session",
    "wire",
    "host",
    "contract",
];

fn source(module: &str) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let file = src.join(format!("{module}.rs"));
    let mut text = std::fs::read_to_string(&file)
        .or_else(|_| std::fs::read_to_string(src.join(module).join("mod.rs")))
        .unwrap_or_else(|e| panic!("cannot read module {module}: {e}"));
    // A directory module's other files (not its tests) belong to it too.
    if let Ok(entries) = std::fs::read_dir(src.join(module)) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".rs") && name != "mod.rs" && !name.starts_with("tests") {
                text.push_str(&std::fs::read_to_string(entry.path()).expect("readable"));
            }
        }
    }
    text
}

/// The `crate::<module>` names a source uses outside comments and outside its test module.
fn imports(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn basic_modules_import_only_modules_below_them() {
    let mut wrong = Vec::new();
    for (level, module) in LAYERS.iter().enumerate() {
        for used in imports(&source(module)) {
            if used == *module {
                continue;
            }
            match LAYERS.iter().position(|m| *m == used) {
                Some(at) if at < level => {}
                Some(_) => wrong.push(format!("{module} imports {used}, which is not below it")),
                // Not a basic module (a role such as exec or order): basic modules must not use one.
                None => wrong.push(format!("{module} imports {used}, which is not a basic module")),
            }
        }
    }
    assert!(wrong.is_empty(), "import layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_import_scanner_sees_code_and_skips_comments_and_tests() {
    let text = "use crate::ids::X;\n/// [`crate::order`]\nfn f() { crate::wire::encode(); }\n#[cfg(test)]\nmod tests { use crate::exec; }";
    assert_eq!(imports(text), ["ids", "wire"]);
}
