//! The CUDA kernels' calling convention, checked without a GPU (issue #20).
//!
//! The emulation tests (`tests/cuda_emulation/`) run each kernel's source under the host's C++
//! compiler, but from harnesses that pass the arguments themselves: the Rust side of a launch —
//! the `.arg(…)` calls between `builder()` and `launch(…)`, and the `repr(C)` structs passed by
//! value — only ever meets the kernel on a GPU. There a missing or extra argument, an output in
//! an input's place, a `u32` where the kernel reads 64 bits, or a struct whose fields drifted
//! from the C one does not fail to compile: it reads garbage, or faults and poisons the context
//! for the rest of the GPU check. This test reads both sides from the source text:
//!
//! - every `extern "C" __global__` kernel of `src/**/*.cu`, after the C preprocessor (the
//!   `_f32` / `_f64` instances are macro expansions), with its parameters;
//! - every launch in `src/**/*.rs`: the kernel it loads (a string literal, through `instance`,
//!   a closure, a local or a method returning literals), and its arguments in order;
//!
//! and checks, for each launch and each kernel it may load: the number of arguments; `&mut`
//! exactly at the kernel's non-`const` pointers; every value argument's Rust type (a `let … as
//! T`, a typed literal, a field or a parameter, resolved in the same file) the C parameter's;
//! and, for pointers whose Rust buffer is allocated in the same function with a concrete type,
//! the element type. Every `repr(C)` struct given to a kernel (`unsafe impl DeviceRepr`) must
//! name its C struct in the `SAFETY` comment above the impl, and have its fields, in order, with
//! the same names and types. The generic launcher `kernels::launch_into_new` (its arguments in a
//! loop) is checked through its callers' kernels: `const` inputs, one output, then 64-bit
//! scalars, as many as its callers pass.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root()).unwrap().display().to_string()
}

/// A kernel parameter: a pointer (its element type, whether `const`) or a value (its type).
#[derive(Debug, Clone, PartialEq)]
enum Param {
    Ptr { elem: String, konst: bool },
    Value(String),
}

/// `const float* x` → pointer to `float`, const; `unsigned int b` → value `unsigned int`.
fn parse_param(text: &str) -> Param {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let konst = text.starts_with("const ");
    let body = text.trim_start_matches("const ");
    match body.rfind('*') {
        Some(star) => Param::Ptr {
            elem: body[..star].trim().to_string(),
            konst,
        },
        None => {
            // The type is every word but the last (the name).
            let words: Vec<&str> = body.split(' ').collect();
            Param::Value(words[..words.len() - 1].join(" "))
        }
    }
}

/// The C types the kernels use, as Rust's.
fn rust_type(c: &str) -> Option<&'static str> {
    Some(match c {
        "float" => "f32",
        "double" => "f64",
        "int" => "i32",
        "unsigned int" => "u32",
        "long long" => "i64",
        "unsigned long long" => "u64",
        "unsigned char" => "u8",
        _ => return None,
    })
}

/// The preprocessed text of a `.cu` source (its macros expanded).
fn preprocess(cu: &Path) -> String {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-E", "-P", "-x", "c++"])
        .arg(cu)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{cxx} -E {}: {e} (the emulation tests need it too)",
                rel(cu)
            )
        });
    assert!(
        out.status.success(),
        "{cxx} -E {}: {}",
        rel(cu),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text from `open` (an opening bracket's index) to its matching close, exclusive.
fn bracketed(text: &str, open: usize) -> &str {
    let bytes = text.as_bytes();
    let (o, c) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        other => panic!("not a bracket: {}", other as char),
    };
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return &text[open + 1..i];
            }
        }
    }
    panic!("unbalanced bracket at {open}");
}

/// Every kernel of every source: name → (source, parameters).
fn kernels() -> BTreeMap<String, (String, Vec<Param>)> {
    let mut sources = Vec::new();
    files(&root().join("src"), "cu", &mut sources);
    let mut out = BTreeMap::new();
    for cu in &sources {
        let text = preprocess(cu);
        let key = "__global__ void ";
        let mut at = 0;
        while let Some(i) = text[at..].find(key) {
            let start = at + i + key.len();
            let open = start + text[start..].find('(').unwrap();
            let name = text[start..open].trim().to_string();
            let params = bracketed(&text, open)
                .split(',')
                .map(parse_param)
                .collect::<Vec<_>>();
            assert!(
                out.insert(name.clone(), (rel(cu), params)).is_none(),
                "kernel {name} defined twice"
            );
            at = open;
        }
    }
    out
}

/// Every `struct rw_… { … };` of every source: name → fields (C type, name).
fn c_structs() -> BTreeMap<String, Vec<(String, String)>> {
    let mut sources = Vec::new();
    files(&root().join("src"), "cu", &mut sources);
    let mut out = BTreeMap::new();
    for cu in &sources {
        let text = preprocess(cu);
        let mut at = 0;
        while let Some(i) = text[at..].find("struct rw_") {
            let start = at + i + "struct ".len();
            let Some(open) = text[start..].find(['{', ';', '(', ' ']).map(|o| start + o) else {
                break;
            };
            let name = text[start..open].trim().to_string();
            let brace = start
                + text[start..]
                    .find(|c: char| !c.is_alphanumeric() && c != '_')
                    .unwrap();
            let brace = brace + text[brace..].find(|c: char| !c.is_whitespace()).unwrap();
            at = brace;
            if text.as_bytes()[brace] != b'{' {
                continue; // a use of the struct, not its definition
            }
            let mut fields = Vec::new();
            for decl in bracketed(&text, brace).split(';') {
                let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
                if decl.is_empty() {
                    continue;
                }
                // `unsigned long long theta, g, m, v` declares four fields.
                let (ty, names) = match decl.find(',') {
                    Some(comma) => {
                        let first = &decl[..comma];
                        let split = first.rfind(' ').unwrap();
                        let mut names = vec![first[split + 1..].to_string()];
                        names.extend(decl[comma + 1..].split(',').map(|n| n.trim().to_string()));
                        (first[..split].to_string(), names)
                    }
                    None => {
                        let split = decl.rfind(' ').unwrap();
                        (
                            decl[..split].to_string(),
                            vec![decl[split + 1..].to_string()],
                        )
                    }
                };
                fields.extend(names.into_iter().map(|n| (ty.clone(), n)));
            }
            out.insert(name, fields);
        }
    }
    out
}

/// The Rust source with comments blanked out (same length, so offsets and lines stay).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => format!("{}{}", &line[..i], " ".repeat(line.len() - i)),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The statement starting at `start` (a `let`), to its `;` outside brackets.
fn statement(text: &str, start: usize) -> &str {
    let mut depth = 0i32;
    for (i, b) in text.bytes().enumerate().skip(start) {
        match b {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            b';' if depth == 0 => return &text[start..i],
            _ => {}
        }
    }
    &text[start..]
}

/// The names a `let` pattern binds (`x`, `mut x`, `(a, mut b)`, `x: u32`), each with its type
/// annotation if any.
fn let_names(pattern: &str) -> Vec<(String, Option<String>)> {
    pattern
        .replace("mut ", "")
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(|n| match n.split_once(':') {
            Some((n, ty)) => (n.trim().to_string(), Some(ty.trim().to_string())),
            None => (n.trim().to_string(), None),
        })
        .collect()
}

/// The last `let NAME =` / `let mut NAME =` (or a tuple binding naming it) before `before`, in
/// the function that encloses `before`.
fn binding<'a>(text: &'a str, name: &str, before: usize) -> Option<&'a str> {
    let mut best = None;
    // The enclosing `fn` (not the end of a name such as `values_fn`).
    let mut at = text[..before]
        .match_indices("fn ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || text.as_bytes()[i - 1].is_ascii_whitespace())
        .last()
        .unwrap_or(0);
    while let Some(i) = text[at..before].find("let ") {
        let start = at + i;
        at = start + 4;
        let stmt = statement(text, start);
        let Some(eq) = stmt.find('=') else { continue };
        if let_names(&stmt[4..eq]).iter().any(|(n, _)| n == name) {
            best = Some(stmt);
        }
    }
    best
}

/// String literals of a piece of code.
fn literals(code: &str) -> Vec<String> {
    code.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The identifier that ends at `end` (the receiver of `x.builder()`, the variant of
/// `Variant(p)`).
fn ident_before(text: &str, end: usize) -> String {
    let start = text[..end]
        .char_indices()
        .rev()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    text[start..end].to_string()
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The kernels a launch's function `recv` may be: every name its binding can produce.
fn kernel_names(text: &str, recv: &str, site: usize) -> Result<Vec<String>, String> {
    let stmt = binding(text, recv, site).ok_or(format!("no `let {recv}` before the launch"))?;
    let generic = |code: &str| code.contains("instance::<");
    let mut instance = generic(stmt);
    let mut names = literals(stmt);
    // A closure loading by name (`func("rankwise_x")`): its literal, through the closure's body.
    let mut closure_body = None;
    if let Some(open) = stmt.find('(') {
        let callee = stmt[stmt.find('=').unwrap() + 1..open].trim();
        if is_ident(callee) && callee != "dev" {
            if let Some(def) = binding(text, callee, site).filter(|d| d.contains('|')) {
                instance |= generic(def);
                closure_body = Some(def);
            }
        }
    }
    if let Some(def) = closure_body {
        // `format!("rankwise_smooth_rank_{name}")` prefixes the closure's argument.
        if let Some(template) = literals(def).into_iter().find(|l| l.contains('{')) {
            let (head, tail) = template.split_once('{').unwrap();
            let tail = &tail[tail.find('}').unwrap() + 1..];
            names = names.iter().map(|n| format!("{head}{n}{tail}")).collect();
        }
    }
    if names.is_empty() {
        // The name in a local (`let kernel = match … { … => "a", … => "b" }`) or returned by a
        // method (`self.kernel()`): every literal there.
        let call = stmt
            .find("get_or_load_custom_func(")
            .ok_or("no kernel name")?;
        let arg = bracketed(stmt, call + "get_or_load_custom_func".len());
        let arg = arg
            .split(',')
            .next()
            .unwrap()
            .trim()
            .trim_start_matches('&');
        let arg = match arg.find("instance::<") {
            Some(_) => bracketed(arg, arg.find(">(").unwrap() + 1).trim(),
            None => arg,
        };
        if let Some(method) = arg.strip_prefix("self.").and_then(|m| m.strip_suffix("()")) {
            let def = text
                .find(&format!("fn {method}("))
                .ok_or(format!("no fn {method}"))?;
            let body = text[def..].find('{').unwrap() + def;
            names = literals(bracketed(text, body));
        } else if is_ident(arg) {
            if let Some(local) = binding(text, arg, site) {
                instance |= generic(local);
                names = literals(local);
            }
        }
    }
    if names.is_empty() {
        return Err(format!(
            "cannot read the kernel's name from `{}`",
            stmt.trim()
        ));
    }
    Ok(if instance {
        names
            .iter()
            .flat_map(|n| [format!("{n}_f32"), format!("{n}_f64")])
            .collect()
    } else {
        names
    })
}

/// The `.arg(…)` expressions of a piece of code, in order.
fn args_in(code: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(".arg(") {
        let open = at + i + ".arg".len();
        args.push(bracketed(code, open).trim().to_string());
        at = open;
    }
    args
}

/// The argument lists a launch may pass: the `.arg(…)` expressions from `site` to the next
/// `.launch(`, once per branch where an `if … { … } else { … }` pushes some of them.
fn launch_args(text: &str, site: usize) -> Vec<Vec<String>> {
    let end = site
        + text[site..]
            .find(".launch(")
            .expect("a builder without launch");
    let code = &text[site..end];
    let Some(branch) = code.find("if ").filter(|_| code.contains("else")) else {
        return vec![args_in(code)];
    };
    let open = branch + code[branch..].find('{').unwrap();
    let first = bracketed(code, open);
    let after = open + first.len() + 2;
    let rest = code[after..].trim_start();
    let rest = rest
        .strip_prefix("else")
        .expect("an `if` without `else` among the arguments");
    let open2 = code.len() - rest.len() + rest.find('{').unwrap();
    let second = bracketed(code, open2);
    let tail = &code[open2 + second.len() + 2..];
    let (head, tail) = (args_in(&code[..branch]), args_in(tail));
    [first, second]
        .iter()
        .map(|b| [head.clone(), args_in(b), tail.clone()].concat())
        .collect()
}

/// The Rust type of a value argument, from the same file: `let x = … as T`, `let x = 1u32`, a
/// tuple of those, a field `x: T`, a parameter `x: T`, `self.0` of a tuple struct, or the
/// payload `p` of a `Variant(p)` pattern.
fn value_type(text: &str, expr: &str, site: usize) -> Option<String> {
    let path = expr.trim_start_matches('&').trim();
    let last = path.rsplit('.').next()?;
    const SCALARS: [&str; 8] = ["u8", "u32", "i32", "u64", "i64", "f32", "f64", "usize"];
    if last == "0" {
        // `self.0` in `impl Name { … }`: `struct Name(pub(…) Type)`.
        let imp = text[..site].rfind("impl ")?;
        let name: String = text[imp + 5..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let def = text.find(&format!("struct {name}("))?;
        let inner = bracketed(text, def + format!("struct {name}").len());
        return inner.split_whitespace().last().map(str::to_string);
    }
    if !path.contains('.') {
        if let Some(stmt) = binding(text, last, site) {
            let eq = stmt.find('=').unwrap();
            let (names, value) = (let_names(&stmt[4..eq]), stmt[eq + 1..].trim());
            let k = names.iter().position(|(n, _)| n == last)?;
            if let Some(ty) = &names[k].1 {
                return Some(ty.clone());
            }
            let parts: Vec<&str> = if names.len() > 1 {
                value
                    .trim_start_matches('(')
                    .trim_end_matches(')')
                    .split(',')
                    .collect()
            } else {
                vec![value]
            };
            let part = parts.get(k)?.trim();
            if let Some((_, ty)) = part.rsplit_once(" as ") {
                return Some(ty.trim().to_string());
            }
            if let Some(s) = SCALARS.iter().find(|s| part.ends_with(**s)) {
                return Some(s.to_string());
            }
            // `f32::NAN`, `f64::MAX`: the type named by the path.
            if part.starts_with("f32::") || part.starts_with("f64::") {
                return Some(part[..3].to_string());
            }
            // A constant.
            if is_ident(part) {
                let def = text.find(&format!("const {part}: "))?;
                let ty = &text[def + format!("const {part}: ").len()..];
                return ty.split([' ', '=']).next().map(str::to_string);
            }
            if part.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                // `Params { … }`, a struct literal.
                return part.split([' ', '{']).next().map(str::to_string);
            }
            return None;
        }
        // `Variant(p)` in a match arm: the variant's payload type.
        let arm = format!("({last})");
        if let Some(i) = text[..site].rfind(&arm) {
            let variant = ident_before(text, i);
            let def = text.find(&format!("{variant}("))?;
            let ty = bracketed(text, def + variant.len());
            if is_ident(ty.trim()) {
                return Some(ty.trim().to_string());
            }
        }
    }
    // A field or a parameter: the last `last: Type` declaration before the site, else the
    // first after it (a struct literal's `field: value` is not a type: a type is a primitive or
    // starts with a capital).
    let decl = format!("{last}: ");
    let type_at = |pos: usize| -> Option<String> {
        if pos > 0
            && (text.as_bytes()[pos - 1].is_ascii_alphanumeric()
                || text.as_bytes()[pos - 1] == b'_')
        {
            return None;
        }
        let ty: String = text[pos + decl.len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let is_type = SCALARS.contains(&ty.as_str())
            || ty.chars().next().is_some_and(|c| c.is_ascii_uppercase());
        is_type.then_some(ty)
    };
    let positions: Vec<usize> = text.match_indices(&decl).map(|(i, _)| i).collect();
    positions
        .iter()
        .rev()
        .filter(|&&i| i < site)
        .chain(positions.iter().filter(|&&i| i >= site))
        .find_map(|&i| type_at(i))
}

/// The element type of a buffer argument, when the same function allocates it with a concrete
/// type (`alloc_zeros::<u32>`, `alloc::<f64>`); `T` for the kernel's float type.
fn buffer_elem(text: &str, expr: &str, site: usize) -> Option<String> {
    let name = expr
        .trim_start_matches('&')
        .trim_start_matches("mut ")
        .trim();
    if !is_ident(name) {
        return None;
    }
    let stmt = binding(text, name, site)?;
    for call in ["alloc_zeros::<", "alloc::<"] {
        if let Some(i) = stmt.find(call) {
            let ty = &stmt[i + call.len()..];
            return Some(ty[..ty.find('>')?].to_string());
        }
    }
    None
}

struct Checker {
    kernels: BTreeMap<String, (String, Vec<Param>)>,
    errors: Vec<String>,
    launches: usize,
    checked: usize,
}

impl Checker {
    fn launch(&mut self, file: &str, line: usize, text: &str, site: usize, recv: &str) {
        let variants = launch_args(text, site);
        let names = match kernel_names(text, recv, site) {
            Ok(names) => names,
            Err(e) => {
                self.errors.push(format!("{file}:{line}: {e}"));
                return;
            }
        };
        self.launches += 1;
        for (name, args) in names
            .iter()
            .flat_map(|n| variants.iter().map(move |a| (n.clone(), a)))
        {
            let Some((_, params)) = self.kernels.get(&name) else {
                self.errors
                    .push(format!("{file}:{line}: loads {name}, which no .cu defines"));
                continue;
            };
            self.checked += 1;
            let here = format!("{file}:{line} → {name}");
            if params.len() != args.len() {
                self.errors.push(format!(
                    "{here}: {} arguments for {} parameters ({args:?} / {params:?})",
                    args.len(),
                    params.len()
                ));
                continue;
            }
            let float = if name.ends_with("_f64") { "f64" } else { "f32" };
            for (k, (arg, param)) in args.iter().zip(params).enumerate() {
                let at = format!("{here}, argument {k} `{arg}`");
                let mutable = arg.starts_with("&mut ");
                match param {
                    Param::Ptr { elem, konst } => {
                        if mutable == *konst {
                            self.errors.push(format!(
                                "{at}: {} for a {}pointer",
                                if mutable { "&mut" } else { "shared" },
                                if *konst { "const " } else { "non-const " }
                            ));
                        }
                        if let (Some(ty), Some(want)) =
                            (buffer_elem(text, arg, site), rust_type(elem))
                        {
                            let ty = if ty == "T" { float.to_string() } else { ty };
                            if ty != want {
                                self.errors
                                    .push(format!("{at}: a buffer of {ty} for {elem}*"));
                            }
                        }
                    }
                    Param::Value(c) => {
                        if mutable {
                            self.errors.push(format!("{at}: &mut for the value {c}"));
                        }
                        let want = rust_type(c)
                            .map(str::to_string)
                            .unwrap_or_else(|| c.clone());
                        match value_type(text, arg, site) {
                            None => self.errors.push(format!(
                                "{at}: cannot resolve its type in the file (the kernel reads {c})"
                            )),
                            Some(ty) if rust_type(c).is_some() && ty != want => self
                                .errors
                                .push(format!("{at}: {ty} where the kernel reads {c} ({want})")),
                            Some(_) => {}
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_launch_passes_what_its_kernel_takes() {
    let mut checker = Checker {
        kernels: kernels(),
        errors: Vec::new(),
        launches: 0,
        checked: 0,
    };
    assert!(
        checker.kernels.len() >= 40,
        "found {} kernels",
        checker.kernels.len()
    );
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    sources.sort();
    let mut generic_launcher = 0;
    for path in &sources {
        let file = rel(path);
        let text = strip_comments(&fs::read_to_string(path).unwrap());
        let mut at = 0;
        while let Some(i) = text[at..].find(".builder()") {
            let site = at + i;
            at = site + 1;
            let line = text[..site].matches('\n').count() + 1;
            let recv = ident_before(&text, site);
            // The generic launcher pushes its inputs and scalars in loops: its callers' kernels
            // are checked below.
            if file == "src/kernels.rs" && text[..site].rfind("fn launch_into_new").is_some() {
                generic_launcher += 1;
                continue;
            }
            checker.launch(&file, line, &text, site, &recv);
        }
    }
    assert_eq!(
        generic_launcher, 1,
        "kernels::launch_into_new's launch not found"
    );
    // `launch_into_new(inputs…, out, scalars…)`: the kernels of its callers.
    for (source, scalars) in [
        ("src/losses/normalize/device.cu", 2),
        ("src/models/layers/relu.cu", 1),
    ] {
        let mut found = 0;
        for (name, (file, params)) in &checker.kernels {
            if file != source {
                continue;
            }
            found += 1;
            let float = if name.ends_with("_f64") {
                "double"
            } else {
                "float"
            };
            let n = params.len();
            let ok = n > scalars + 1
                && params[..n - scalars - 1].iter().all(|p| {
                    *p == Param::Ptr {
                        elem: float.into(),
                        konst: true,
                    }
                })
                && params[n - scalars - 1]
                    == Param::Ptr {
                        elem: float.into(),
                        konst: false,
                    }
                && params[n - scalars..]
                    .iter()
                    .all(|p| *p == Param::Value("unsigned long long".into()));
            if !ok {
                checker.errors.push(format!(
                    "{name} ({file}): launch_into_new passes const {float}* inputs, one {float}* \
                     output and {scalars} unsigned long long: {params:?}"
                ));
            }
        }
        assert!(found >= 2, "{source}: {found} kernels");
    }
    assert!(
        checker.launches >= 30,
        "found {} launches",
        checker.launches
    );
    assert!(
        checker.errors.is_empty(),
        "{} launch(es) disagree with their kernel:\n{}",
        checker.errors.len(),
        checker.errors.join("\n")
    );
    eprintln!(
        "{} launches, {} (launch, kernel) pairs checked",
        checker.launches, checker.checked
    );
}

#[test]
fn every_struct_given_to_a_kernel_has_the_c_layout() {
    let c = c_structs();
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    let mut errors = Vec::new();
    let mut checked = 0;
    for path in &sources {
        let file = rel(path);
        let raw = fs::read_to_string(path).unwrap();
        let lines: Vec<&str> = raw.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let Some(rest) = line.trim().strip_prefix("unsafe impl DeviceRepr for ") else {
                continue;
            };
            let name = rest.trim_end_matches(" {}").trim();
            // The SAFETY comment right above names the C struct.
            let mut comment = String::new();
            for above in lines[..n].iter().rev() {
                match above.trim().strip_prefix("//") {
                    Some(text) => comment.insert_str(0, text),
                    None => break,
                }
            }
            let Some(c_name) = comment
                .split('`')
                .find_map(|w| w.strip_prefix("struct rw_").map(|s| format!("rw_{s}")))
            else {
                errors.push(format!(
                    "{file}:{}: {name}'s SAFETY comment names no `struct rw_…`",
                    n + 1
                ));
                continue;
            };
            let Some(c_fields) = c.get(&c_name) else {
                errors.push(format!("{file}:{}: no C struct {c_name}", n + 1));
                continue;
            };
            let text = strip_comments(&raw);
            let def = text
                .find(&format!("struct {name} {{"))
                .unwrap_or_else(|| panic!("{file}: struct {name} not found"));
            let before = &text[..def];
            let attrs = &before[before.rfind(['}', ';']).unwrap_or(0)..];
            if !attrs.contains("#[repr(C)]") {
                errors.push(format!("{file}: {name} is not #[repr(C)]"));
            }
            let body = bracketed(&text, def + format!("struct {name} ").len());
            let fields: Vec<(String, String)> = body
                .split(',')
                .filter_map(|f| f.split_once(':'))
                .map(|(n, t)| {
                    let n = n.split_whitespace().last().unwrap().to_string();
                    (t.trim().to_string(), n)
                })
                .collect();
            let want: Vec<(String, String)> = c_fields
                .iter()
                .map(|(t, n)| (rust_type(t).unwrap_or(t).to_string(), n.clone()))
                .collect();
            if fields != want {
                errors.push(format!(
                    "{file}: {name} has (type, field) {fields:?}, {c_name} {want:?}"
                ));
            }
            checked += 1;
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert!(checked >= 7, "{checked} structs");
}
