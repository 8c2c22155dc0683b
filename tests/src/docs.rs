//! The repository's Markdown — README.md and the book under docs/ — as the documentation tests
//! read it: its files, the anchors of its headings, its links and its marked example blocks.
//!
//! A YAML example is marked on the line before its fence: `<!-- example: NAME (KIND, ...) -->`,
//! one kind per YAML document in the block: `sni-router`, `proxy-server`, `proxy-agent` (a config
//! file), `route-file`, `cluster-file` (a file of `routes_dir` / `clusters_dir`) or `other`
//! (third-party YAML such as a Kubernetes object).

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the repository").to_path_buf()
}

/// README.md and every `.md` file under docs/, relative to the root, sorted.
pub fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for e in entries.map(|e| e.expect("a directory entry")) {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p.strip_prefix(root).expect("under the root").to_path_buf());
            }
        }
    }
    let root = repo_root();
    let mut out = vec![PathBuf::from("README.md")];
    walk(&root.join("docs"), &root, &mut out);
    out.sort();
    out
}

/// The text of `rel` (relative to the root).
pub fn read(rel: impl AsRef<Path>) -> String {
    let p = repo_root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
pub fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, l));
        }
    }
    out
}

/// Every code span of the book's prose: the document (relative to the root), the line's
/// 1-based number and the span's text.
pub fn code_spans() -> Vec<(PathBuf, usize, String)> {
    let mut out = Vec::new();
    for doc in markdown_files() {
        let text = read(&doc);
        for (n, line) in prose(&text) {
            out.extend(line.split('`').skip(1).step_by(2).map(|span| (doc.clone(), n, span.to_owned())));
        }
    }
    out
}

/// Every `.rs` file of the repository, relative to the root, sorted; build outputs (`target/`)
/// and hidden folders left out.
pub fn rust_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                walk(&p, root, out);
            } else if name.ends_with(".rs") {
                out.push(p.strip_prefix(root).expect("under the root").to_path_buf());
            }
        }
    }
    let root = repo_root();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

/// The anchors of the headings of `text`, as GitHub makes them (a repeated heading gets `-1`,
/// `-2`, ...), plus explicit `<a id="...">` / `<a name="...">` anchors.
pub fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, l) in prose(text) {
        for attr in ["<a id=\"", "<a name=\""] {
            if let Some(rest) = l.split(attr).nth(1).and_then(|r| r.split('"').next()) {
                out.push(rest.to_owned());
            }
        }
        let Some(h) = l.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if !h.starts_with(' ') {
            continue;
        }
        let base = seedgate_config::reference::anchor(h.trim());
        let n =
            out.iter().filter(|a| **a == base || a.strip_prefix(&format!("{base}-")).is_some_and(is_number)).count();
        out.push(if n == 0 { base } else { format!("{base}-{n}") });
    }
    out
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The targets of the inline links and images of `text` (outside code), with their line numbers.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n, after[..end].trim().to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// `line` with the contents of its code spans removed (a link's text may be one; its target not).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// One marked block.
#[derive(Debug, Clone)]
pub struct Example {
    /// The file (relative to the root) and the line of the marker.
    pub file: PathBuf,
    pub line: usize,
    pub name: String,
    /// One per YAML document of the block.
    pub kinds: Vec<String>,
    pub yaml: String,
}

impl Example {
    /// The block's YAML documents (split at `---` lines), each with its kind.
    pub fn documents(&self) -> Vec<(String, String)> {
        let docs = documents(&self.yaml);
        assert_eq!(
            docs.len(),
            self.kinds.len(),
            "{}:{}: example {} names {} kinds for {} YAML documents",
            self.file.display(),
            self.line,
            self.name,
            self.kinds.len(),
            docs.len()
        );
        self.kinds.iter().cloned().zip(docs).collect()
    }
}

/// The name and kinds of a marker line, if it is one.
fn marker(line: &str) -> Option<(String, Vec<String>)> {
    let inner = line.trim().strip_prefix("<!-- example:")?.strip_suffix("-->")?.trim();
    let (name, kinds) = inner.split_once(" (")?;
    let kinds = kinds.strip_suffix(')')?.split(',').map(|k| k.trim().to_owned()).collect();
    Some((name.trim().to_owned(), kinds))
}

/// Every marked block of every Markdown file, and every ```yaml block without a marker
/// (`(file, line)`), which the tests refuse.
pub fn examples() -> (Vec<Example>, Vec<(PathBuf, usize)>) {
    let (mut found, mut unmarked) = (Vec::new(), Vec::new());
    for file in markdown_files() {
        let text = read(&file);
        let lines: Vec<&str> = text.lines().collect();
        let mut fenced = false;
        for (i, l) in lines.iter().enumerate() {
            let fence = l.trim_start().starts_with("```");
            if fence && !fenced && l.trim() == "```yaml" {
                match i.checked_sub(1).and_then(|p| marker(lines[p])) {
                    Some((name, kinds)) => {
                        let body: Vec<&str> =
                            lines[i + 1..].iter().take_while(|b| b.trim() != "```").copied().collect();
                        let yaml = body.join("\n") + "\n";
                        found.push(Example { file: file.clone(), line: i, name, kinds, yaml });
                    }
                    None => unmarked.push((file.clone(), i + 1)),
                }
            }
            if fence {
                fenced = !fenced;
            }
        }
    }
    (found, unmarked)
}

/// The block marked `name` (there must be exactly one).
pub fn example(name: &str) -> Example {
    let (all, _) = examples();
    let mut it = all.into_iter().filter(|e| e.name == name);
    let e = it.next().unwrap_or_else(|| panic!("no block is marked <!-- example: {name} (...) -->"));
    assert!(it.next().is_none(), "two blocks are marked example {name}");
    e
}

/// YAML documents separated by `---` lines.
pub fn documents(yaml: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for l in yaml.lines() {
        if l.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().expect("never empty");
            d.push_str(l);
            d.push('\n');
        }
    }
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_links_and_markers() {
        let text =
            "# A `b` c\n\n## Again\n## Again\n```\n# not a heading [x](y)\n```\nsee [t](p.md#a-b-c) and `[u](v)`\n";
        assert_eq!(anchors(text), ["a-b-c", "again", "again-1"]);
        assert_eq!(links(text), [(8, "p.md#a-b-c".to_owned())]);
        assert_eq!(
            marker("<!-- example: p2 (proxy-agent, sni-router) -->"),
            Some(("p2".into(), vec!["proxy-agent".into(), "sni-router".into()]))
        );
        assert_eq!(marker("<!-- example: p2 -->"), None);
        assert_eq!(documents("a: 1\n---\nb: 2\n"), ["a: 1\n", "b: 2\n"]);
    }
}
