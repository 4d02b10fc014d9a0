//! Man pages and shell completions from a binary's clap definition, written by its
//! hidden `generate` subcommand (`padll generate man DIR`, `cheferd generate
//! completions DIR`) so they always match the binary; `scripts/install.sh` runs them.
//! Included by `padll`, `cheferd` and `cheferd-lab` with `#[path = "…/scripts/cli-docs.rs"] mod cli_docs;`.
//!
//! A page is clap's (name, synopsis, description, options, subcommands) plus what clap
//! cannot know, given by the binary as [`Extras`]: the exit status, files and examples.
//! The configuration files' pages (section 5) are etc/README.md's sections turned into
//! roff, so the reference and the page are one text.

use clap_complete::Shell;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use roff::{bold, roman, Inline, Roff};
use std::path::{Path, PathBuf};

/// What `generate` writes.
#[derive(clap::Subcommand)]
pub enum Generate {
    /// One man page per command and subcommand (`NAME.1`, `NAME-SUB.1`, …) and the
    /// binary's configuration file pages (`FILE.5`) into DIR.
    Man {
        /// Directory to write to (created if missing).
        dir: PathBuf,
    },
    /// Completions for bash (`NAME.bash`), zsh (`_NAME`) and fish (`NAME.fish`) into DIR.
    Completions {
        /// Directory to write to (created if missing).
        dir: PathBuf,
    },
}

/// A binary's man pages beyond its clap definition.
pub struct Extras {
    /// The EXIT STATUS of every page that does not give its own: (code, meaning).
    pub exit_status: &'static [(&'static str, &'static str)],
    /// Additions to single pages.
    pub pages: &'static [Page],
    /// Configuration-file pages (section 5) this binary writes.
    pub config_pages: &'static [ConfigPage],
}

/// What one page (`padll-run`, `cheferd-ctl`, …) adds.
pub struct Page {
    /// The page's name: the command path joined by `-`.
    pub name: &'static str,
    /// Its own EXIT STATUS instead of the binary's.
    pub exit_status: Option<&'static [(&'static str, &'static str)]>,
    /// FILES: (path, what it is).
    pub files: &'static [(&'static str, &'static str)],
    /// EXAMPLES: (what it does, the command).
    pub examples: &'static [(&'static str, &'static str)],
}

/// A configuration file's page, made of sections of etc/README.md.
pub struct ConfigPage {
    /// The file's name, which is the page's: `global.toml`.
    pub file: &'static str,
    /// The NAME line's description.
    pub summary: &'static str,
    /// The level-2 headings of etc/README.md whose sections make the page, in order;
    /// the first becomes its DESCRIPTION.
    pub sections: &'static [&'static str],
    /// SEE ALSO.
    pub see_also: &'static str,
}

/// The configuration reference the section-5 pages are made from.
const CONFIG_REFERENCE: &str = include_str!("../etc/README.md");

/// Writes what `what` asks for, from `command` (the binary's full clap definition);
/// an error is one line naming the directory.
pub fn generate(
    what: &Generate,
    mut command: clap::Command,
    extras: &Extras,
) -> Result<(), String> {
    let dir = match what {
        Generate::Man { dir } | Generate::Completions { dir } => dir,
    };
    let failed = |e: std::io::Error| format!("cannot write to {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(failed)?;
    match what {
        Generate::Man { .. } => {
            let mut command = command.disable_help_subcommand(true);
            command.build();
            write_command_pages(&command, extras, extras.exit_status, dir).map_err(failed)?;
            for page in extras.config_pages {
                let path = dir.join(format!("{}.5", page.file));
                std::fs::write(path, config_page(page, &version(&command))?).map_err(failed)?;
            }
            Ok(())
        }
        Generate::Completions { .. } => {
            let name = command.get_name().to_string();
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                clap_complete::generate_to(shell, &mut command, &name, dir).map_err(failed)?;
            }
            Ok(())
        }
    }
}

fn version(command: &clap::Command) -> String {
    command.get_version().unwrap_or_default().to_string()
}

/// The page of `command` and of each visible subcommand, recursively; a page's EXIT
/// STATUS is also its subcommands' unless they give their own.
fn write_command_pages(
    command: &clap::Command,
    extras: &Extras,
    exit_status: &[(&str, &str)],
    dir: &Path,
) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    let name = man.get_filename();
    let added = extras
        .pages
        .iter()
        .find(|p| name == format!("{}.1", p.name));
    let exit_status = added.and_then(|p| p.exit_status).unwrap_or(exit_status);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_command_pages(sub, extras, exit_status, dir)?;
    }
    let mut page = Vec::new();
    man.render(&mut page)?;
    let page = String::from_utf8_lossy(&page);
    std::fs::write(
        dir.join(&name),
        with_sections(&page, &sections(exit_status, added)),
    )
}

/// EXIT STATUS, FILES and EXAMPLES of a page, as roff without its preamble.
fn sections(exit_status: &[(&str, &str)], page: Option<&Page>) -> String {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in exit_status {
        roff.control("TP", [])
            .text([bold(*code)])
            .text([roman(*meaning)]);
    }
    let (files, examples) = page.map_or((&[][..], &[][..]), |p| (p.files, p.examples));
    if !files.is_empty() {
        roff.control("SH", ["FILES"]);
        for (path, what) in files {
            roff.control("TP", [])
                .text([bold(*path)])
                .text([roman(*what)]);
        }
    }
    if !examples.is_empty() {
        roff.control("SH", ["EXAMPLES"]);
        for (what, command) in examples {
            roff.control("PP", []).text([roman(*what)]);
            roff.control("PP", [])
                .control("RS", ["4"])
                .control("nf", []);
            roff.text([bold(*command)]);
            roff.control("fi", []).control("RE", []);
        }
    }
    without_preamble(&roff)
}

/// roff renders a preamble (how to print apostrophes) before every document; a page
/// needs it once.
fn without_preamble(roff: &Roff) -> String {
    let preamble = Roff::new().render();
    roff.render()
        .strip_prefix(&preamble)
        .unwrap_or_default()
        .to_string()
}

/// clap's page with `sections` before its VERSION section (the end of the page proper).
fn with_sections(page: &str, sections: &str) -> String {
    match page.find("\n.SH VERSION\n") {
        Some(at) => format!("{}\n{sections}{}", &page[..at], &page[at + 1..]),
        None => format!("{page}{sections}"),
    }
}

/// A configuration file's page: its sections of etc/README.md in roff.
fn config_page(page: &ConfigPage, version: &str) -> Result<String, String> {
    let mut roff = Roff::new();
    let title = page.file.to_uppercase();
    let source = format!("PADLL-rs {version}");
    roff.control(
        "TH",
        [title.as_str(), "5", "", source.as_str(), "File Formats"],
    );
    roff.control("SH", ["NAME"]);
    roff.text([roman(format!("{} - {}", page.file, page.summary))]);
    for (i, heading) in page.sections.iter().enumerate() {
        let body = markdown_section(CONFIG_REFERENCE, heading).ok_or_else(|| {
            format!(
                "etc/README.md has no section '## {heading}' for {}(5)",
                page.file
            )
        })?;
        let title = if i == 0 {
            "DESCRIPTION".to_string()
        } else {
            plain(heading).to_uppercase()
        };
        roff.control("SH", [title.as_str()]);
        markdown_to_roff(body, &mut roff);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(page.see_also)]);
    Ok(roff.render())
}

/// The body of the level-2 section of `markdown` headed `heading` (up to the next
/// level-2 heading).
fn markdown_section<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let start = markdown.find(&format!("\n## {heading}\n"))?;
    let body = &markdown[start + heading.len() + 5..];
    Some(&body[..body.find("\n## ").unwrap_or(body.len())])
}

/// A heading without its markdown: "`padll.toml` (the stage)" → "padll.toml (the stage)".
fn plain(text: &str) -> String {
    text.replace('`', "")
}

/// Markdown as man(7) roff: paragraphs, `###` headings as subsections, lists, code
/// blocks, and tables as one tagged paragraph per row (a table of six columns does not
/// fit a terminal): the first cell as the tag, every other cell after its column's name.
/// Links keep their text; code and bold are bold.
fn markdown_to_roff(markdown: &str, roff: &mut Roff) {
    let mut line: Vec<Inline> = Vec::new();
    let mut bold_depth = 0;
    let mut table: Vec<Vec<Vec<Inline>>> = Vec::new();
    let mut cell: Vec<Inline> = Vec::new();
    let mut in_cell = false;
    let mut code_block: Option<String> = None;
    let styled = |text: String, bold_depth: usize| {
        if bold_depth > 0 {
            bold(text)
        } else {
            roman(text)
        }
    };
    for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
        let target = if in_cell { &mut cell } else { &mut line };
        match event {
            Event::Start(Tag::Paragraph) => line.clear(),
            Event::End(TagEnd::Paragraph) => {
                roff.control("PP", []).text(std::mem::take(&mut line));
            }
            Event::Start(Tag::Heading { .. }) => line.clear(),
            Event::End(TagEnd::Heading(_)) => {
                let text = inline_text(&std::mem::take(&mut line));
                roff.control("SS", [text.as_str()]);
            }
            Event::Start(Tag::Item) => line.clear(),
            Event::End(TagEnd::Item) => {
                roff.control("IP", ["\\(bu", "2"])
                    .text(std::mem::take(&mut line));
            }
            Event::Start(Tag::CodeBlock(_)) => code_block = Some(String::new()),
            Event::End(TagEnd::CodeBlock) => {
                let code = code_block.take().unwrap_or_default();
                roff.control("PP", [])
                    .control("RS", ["4"])
                    .control("nf", []);
                roff.text([roman(code.trim_end())]);
                roff.control("fi", []).control("RE", []);
            }
            Event::Start(Tag::Strong) => bold_depth += 1,
            Event::End(TagEnd::Strong) => bold_depth -= 1,
            Event::Start(Tag::TableCell) => {
                in_cell = true;
                cell.clear();
            }
            Event::End(TagEnd::TableCell) => {
                in_cell = false;
                if let Some(row) = table.last_mut() {
                    row.push(std::mem::take(&mut cell));
                }
            }
            Event::Start(Tag::TableHead | Tag::TableRow) => table.push(Vec::new()),
            Event::End(TagEnd::Table) => table_to_roff(&std::mem::take(&mut table), roff),
            Event::Text(text) => match &mut code_block {
                Some(code) => code.push_str(&text),
                None => target.push(styled(text.into_string(), bold_depth)),
            },
            Event::Code(code) => target.push(bold(code.into_string())),
            Event::SoftBreak => target.push(roman(" ")),
            Event::HardBreak => target.push(roff::line_break()),
            _ => {}
        }
    }
}

/// A table as one `.TP` per row: the row's first cell, then "column: cell" for the others.
fn table_to_roff(table: &[Vec<Vec<Inline>>], roff: &mut Roff) {
    let Some((head, rows)) = table.split_first() else {
        return;
    };
    let names: Vec<String> = head.iter().map(|cell| inline_text(cell)).collect();
    for row in rows {
        let Some((tag, cells)) = row.split_first() else {
            continue;
        };
        roff.control("TP", []).text(tag.clone());
        let mut body: Vec<Inline> = Vec::new();
        for (name, cell) in names.iter().skip(1).zip(cells) {
            if cell.is_empty() {
                continue;
            }
            if !body.is_empty() {
                body.push(roff::line_break());
            }
            body.push(roman(format!("{name}: ")));
            body.extend(cell.iter().cloned());
        }
        roff.text(body);
    }
}

/// The text of inlines, without styles.
fn inline_text(inlines: &[Inline]) -> String {
    inlines
        .iter()
        .map(|inline| match inline {
            Inline::Roman(text) | Inline::Bold(text) | Inline::Italic(text) => text.as_str(),
            Inline::LineBreak => " ",
        })
        .collect()
}
