//! Cache mode II's write-back: what to do at home to make one directory
//! there equal the cache's (docs/architecture.md, "Cache mode II"). Pure
//! logic: [`plan`] takes the two sides of one directory and returns the
//! home operations, in an order that never loses an object another step
//! still needs. The server that owns the directory gathers the inputs and
//! runs the steps (`service/pusher.rs`); the simulation in the tests below
//! reconciles whole random trees with it.
//!
//! | cache has at `n` | home has at `n` | step |
//! |---|---|---|
//! | O, never pushed | — | [`Step::Create`] |
//! | O, home has it at (D', n') ≠ (D, n), and the cache still names O there | — | [`Step::Link`] |
//! | O, home has it at (D', n') ≠ (D, n), no longer named there | — | [`Step::Rename`] |
//! | O | O (the same object at home) | nothing |
//! | O, home has it at (D, n) | nothing, or another object | [`Step::Create`] (lost at home) |
//! | anything else | H, an object the cache will move elsewhere | [`Step::Aside`] if `n` is wanted here, else nothing |
//! | anything else | H, an object kept here under another name | [`Step::Unlink`] |
//! | O, kept; home also has it at (D', n'), no longer named so | — | [`Step::Unlink`] of (D', n') |
//! | anything else | H, the cache's (made, moved or fetched there before) | [`Step::Remove`] (a directory with its contents) |
//! | anything else | H, not the cache's | [`Step::Remove`]; nothing with `keep_unknown` (`iw`: another writer's) |
//! | O a second time (another name of an object placed here) | — | [`Step::Link`] from its first name |
//!
//! Order: asides, removals, then renames and links (from where home has the
//! object after the asides), then creates, then the links that give a
//! created object its other names here. An aside renames an object that
//! is still to move to a temporary name in the same directory, so that a
//! name it held can be taken first (a swap of two names, or a name reused
//! by an object moved in); the move then starts from the temporary name.

use std::collections::{BTreeMap, BTreeSet};

/// An object, by its id in the cache.
pub type Obj = u64;

/// Where home has an object: its directory (by the directory's id in the
/// cache) and its name there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Spot {
    /// The directory.
    pub dir: Obj,
    /// The name.
    pub name: Vec<u8>,
}

/// One entry of the directory as the cache has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The name.
    pub name: Vec<u8>,
    /// The object it names.
    pub obj: Obj,
    /// Where home has the object, as last pushed (or fetched); `None` if
    /// it was never pushed.
    pub home_at: Option<Spot>,
    /// Whether the cache still names the object at `home_at` (then a new
    /// name here is a hard link, not a move).
    pub still_there: bool,
}

/// One entry of the directory as home has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtHome {
    /// The name.
    pub name: Vec<u8>,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// The cache object it is, if known (the entry this directory had
    /// under that name, or the name's departure record).
    pub obj: Option<Obj>,
    /// The cache names that object elsewhere and not here: its new
    /// directory's reconciliation moves it there.
    pub moving: bool,
}

/// One operation at home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Rename `name` to `temp` in this directory; the object's home
    /// location becomes (this directory, `temp`).
    Aside {
        /// The name it has.
        name: Vec<u8>,
        /// The temporary name.
        temp: Vec<u8>,
        /// The object.
        obj: Obj,
    },
    /// Remove the name `at` (here or in another directory) of an object
    /// home keeps at `now_at` in this directory (where the object's
    /// location record moves, if it was `at`).
    Unlink {
        /// The name to remove.
        at: Spot,
        /// The object.
        obj: Obj,
        /// A name it keeps here.
        now_at: Spot,
    },
    /// Remove `name` (a directory with everything in it).
    Remove {
        /// The name.
        name: Vec<u8>,
        /// Whether it is a directory.
        is_dir: bool,
    },
    /// Move the object from `from` to `name` here.
    Rename {
        /// The object.
        obj: Obj,
        /// Where home has it.
        from: Spot,
        /// Its name here.
        name: Vec<u8>,
    },
    /// Give the object at `from` the new name `name` here.
    Link {
        /// The object.
        obj: Obj,
        /// Where home has it.
        from: Spot,
        /// Its new name here.
        name: Vec<u8>,
    },
    /// Make the object at home under `name` (with its attributes; a file's
    /// data follows).
    Create {
        /// The object.
        obj: Obj,
        /// Its name here.
        name: Vec<u8>,
    },
}

/// The temporary name an object is set aside under: not a name a program
/// would pick, and one per object, so that a step replayed after a crash
/// finds it again.
pub fn temp_name(obj: Obj) -> Vec<u8> {
    format!(".morris-aside-{obj:016x}").into_bytes()
}

/// The object a temporary name of [`temp_name`] was made for.
pub fn parse_temp(name: &[u8]) -> Option<Obj> {
    let hex = name.strip_prefix(b".morris-aside-")?;
    if hex.len() != 16 {
        return None;
    }
    let hex = std::str::from_utf8(hex).ok()?;
    u64::from_str_radix(hex, 16).ok()
}

/// The cache object home's entry `name` of a directory is, from what the
/// directory's owner knows: the cache's entry under that name if home's
/// entry is that object (`same_as_entry`: home's file id there equals the
/// one the object's link records), else the object that left that name
/// since the last push (`departed`), else the object a temporary name was
/// made for. `None`: not the cache's (a single-writer cache removes it).
pub fn identify(name: &[u8], same_as_entry: Option<Obj>, departed: Option<Obj>) -> Option<Obj> {
    same_as_entry.or(departed).or_else(|| parse_temp(name))
}

/// The steps that make home's directory `dir` equal the cache's.
/// `keep_unknown` (independent writers): a name home has that is not the
/// cache's (`obj` `None`) is another writer's and stays; else it is
/// removed.
pub fn plan(dir: Obj, cache: &[Named], home: &[AtHome], keep_unknown: bool) -> Vec<Step> {
    let here = |name: &[u8]| Spot {
        dir,
        name: name.to_vec(),
    };
    let at_home: BTreeMap<&[u8], &AtHome> = home.iter().map(|h| (h.name.as_slice(), h)).collect();
    let wanted: BTreeSet<&[u8]> = cache.iter().map(|c| c.name.as_slice()).collect();
    // Names whose home entry already is what the cache names there, and
    // where home has each object from the steps before the one at hand.
    let mut placed: BTreeMap<Obj, Spot> = BTreeMap::new();
    let mut kept: BTreeSet<&[u8]> = BTreeSet::new();
    for c in cache {
        if at_home
            .get(c.name.as_slice())
            .is_some_and(|h| h.obj == Some(c.obj))
        {
            kept.insert(c.name.as_slice());
            placed.entry(c.obj).or_insert_with(|| here(&c.name));
        }
    }

    let mut asides = Vec::new();
    let mut removes = Vec::new();
    // An object kept here that home also has under a name the cache gave
    // up elsewhere (a move whose new name was already at home as a link):
    // that old name goes.
    for c in cache {
        if !kept.contains(c.name.as_slice()) || c.still_there {
            continue;
        }
        if let Some(spot) = &c.home_at {
            if spot.dir != dir && placed.get(&c.obj) == Some(&here(&c.name)) {
                removes.push(Step::Unlink {
                    at: spot.clone(),
                    obj: c.obj,
                    now_at: here(&c.name),
                });
            }
        }
    }
    let mut moved_aside: BTreeMap<Obj, Spot> = BTreeMap::new();
    for h in home {
        if kept.contains(h.name.as_slice()) {
            continue;
        }
        match h.obj {
            // Another name of an object that stays here under a kept name.
            Some(obj) if placed.contains_key(&obj) => removes.push(Step::Unlink {
                at: here(&h.name),
                obj,
                now_at: placed[&obj].clone(),
            }),
            Some(obj) if h.moving => {
                if wanted.contains(h.name.as_slice()) {
                    let temp = temp_name(obj);
                    moved_aside.insert(obj, here(&temp));
                    asides.push(Step::Aside {
                        name: h.name.clone(),
                        temp,
                        obj,
                    });
                }
            }
            None if keep_unknown => {}
            _ => removes.push(Step::Remove {
                name: h.name.clone(),
                is_dir: h.is_dir,
            }),
        }
    }

    let mut moves = Vec::new();
    let mut creates = Vec::new();
    for c in cache {
        if kept.contains(c.name.as_slice()) {
            continue;
        }
        if let Some(at) = placed.get(&c.obj) {
            // Placed by a step before (or kept): one more name of it.
            moves.push(Step::Link {
                obj: c.obj,
                from: at.clone(),
                name: c.name.clone(),
            });
            continue;
        }
        match &c.home_at {
            Some(spot) if *spot != here(&c.name) => {
                let from = moved_aside
                    .get(&c.obj)
                    .cloned()
                    .unwrap_or_else(|| spot.clone());
                moves.push(if c.still_there {
                    Step::Link {
                        obj: c.obj,
                        from,
                        name: c.name.clone(),
                    }
                } else {
                    Step::Rename {
                        obj: c.obj,
                        from,
                        name: c.name.clone(),
                    }
                });
            }
            // Never pushed, or home lost it from its place here.
            _ => creates.push(Step::Create {
                obj: c.obj,
                name: c.name.clone(),
            }),
        }
        placed.insert(c.obj, here(&c.name));
    }
    // Creates before the links that give the created objects more names.
    let (links_to_new, moves): (Vec<Step>, Vec<Step>) = moves.into_iter().partition(|m| {
        matches!(m, Step::Link { obj, .. } if creates.iter().any(|c| matches!(c, Step::Create { obj: o, .. } if o == obj)))
    });
    asides
        .into_iter()
        .chain(removes)
        .chain(moves)
        .chain(creates)
        .chain(links_to_new)
        .collect()
}

#[cfg(test)]
mod tests;
