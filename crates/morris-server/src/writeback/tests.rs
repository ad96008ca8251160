//! The planner on its own cases, and a deterministic simulation: random
//! trees, pushed to a model home, changed at random in the cache
//! (creates, removals, renames across directories, swaps, hard links,
//! `rm -r`), reconciled directory by directory from the top with [`plan`]
//! — with crashes in the middle of a directory's steps — until home's tree
//! equals the cache's.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn n(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn spot(dir: Obj, name: &str) -> Spot {
    Spot { dir, name: n(name) }
}

#[test]
fn nothing_to_do_when_both_sides_agree() {
    let cache = [Named {
        name: n("a"),
        obj: 10,
        home_at: Some(spot(1, "a")),
        still_there: true,
    }];
    let home = [AtHome {
        name: n("a"),
        is_dir: false,
        obj: Some(10),
        moving: false,
    }];
    assert!(plan(1, &cache, &home, false).is_empty());
}

#[test]
fn a_swap_goes_through_temporary_names() {
    // mv a t; mv b a; mv t b
    let cache = [
        Named {
            name: n("a"),
            obj: 20,
            home_at: Some(spot(1, "b")),
            still_there: false,
        },
        Named {
            name: n("b"),
            obj: 10,
            home_at: Some(spot(1, "a")),
            still_there: false,
        },
    ];
    let home = [
        AtHome {
            name: n("a"),
            is_dir: false,
            obj: Some(10),
            moving: true,
        },
        AtHome {
            name: n("b"),
            is_dir: false,
            obj: Some(20),
            moving: true,
        },
    ];
    let steps = plan(1, &cache, &home, false);
    assert_eq!(
        steps,
        vec![
            Step::Aside {
                name: n("a"),
                temp: temp_name(10),
                obj: 10
            },
            Step::Aside {
                name: n("b"),
                temp: temp_name(20),
                obj: 20
            },
            Step::Rename {
                obj: 20,
                from: Spot {
                    dir: 1,
                    name: temp_name(20)
                },
                name: n("a")
            },
            Step::Rename {
                obj: 10,
                from: Spot {
                    dir: 1,
                    name: temp_name(10)
                },
                name: n("b")
            },
        ]
    );
    assert_eq!(parse_temp(&temp_name(0xdead_beef)), Some(0xdead_beef));
    assert_eq!(parse_temp(b".morris-aside-zz"), None);
}

#[test]
fn a_name_removed_and_made_again_is_removed_then_created() {
    let cache = [Named {
        name: n("f"),
        obj: 30,
        home_at: None,
        still_there: false,
    }];
    let home = [AtHome {
        name: n("f"),
        is_dir: false,
        obj: Some(10),
        moving: false,
    }];
    assert_eq!(
        plan(1, &cache, &home, false),
        vec![
            Step::Remove {
                name: n("f"),
                is_dir: false
            },
            Step::Create {
                obj: 30,
                name: n("f")
            },
        ]
    );
}

#[test]
fn an_independent_writers_names_stay_and_the_caches_removals_go() {
    // Home has `theirs` (another writer's: not the cache's), `gone` (an
    // object the cache fetched and removed) and `kept`.
    let cache = [
        Named {
            name: n("kept"),
            obj: 10,
            home_at: Some(spot(1, "kept")),
            still_there: true,
        },
        Named {
            name: n("new"),
            obj: 30,
            home_at: None,
            still_there: false,
        },
    ];
    let home = [
        AtHome {
            name: n("kept"),
            is_dir: false,
            obj: Some(10),
            moving: false,
        },
        AtHome {
            name: n("theirs"),
            is_dir: false,
            obj: None,
            moving: false,
        },
        AtHome {
            name: n("gone"),
            is_dir: true,
            obj: Some(20),
            moving: false,
        },
    ];
    let create = Step::Create {
        obj: 30,
        name: n("new"),
    };
    let remove = Step::Remove {
        name: n("gone"),
        is_dir: true,
    };
    assert_eq!(
        plan(1, &cache, &home, true),
        vec![remove.clone(), create.clone()]
    );
    // A single writer removes what is not the cache's.
    let sw = plan(1, &cache, &home, false);
    assert!(sw.contains(&Step::Remove {
        name: n("theirs"),
        is_dir: false
    }));
    assert!(sw.contains(&remove) && sw.contains(&create));
}

// ---------------------------------------------------------------- simulation

/// A tree: directories by id, each a map of names to objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Tree {
    dirs: BTreeMap<Obj, BTreeMap<Vec<u8>, Obj>>,
}

const ROOT: Obj = 1;

/// A name, its object, and (for a directory) its entries' names, objects
/// and entry counts.
type Shape = (Vec<u8>, Obj, Vec<(Vec<u8>, Obj, usize)>);

impl Tree {
    fn new() -> Tree {
        let mut t = Tree::default();
        t.dirs.insert(ROOT, BTreeMap::new());
        t
    }

    fn is_dir(&self, o: Obj) -> bool {
        self.dirs.contains_key(&o)
    }

    fn get(&self, s: &Spot) -> Option<Obj> {
        self.dirs.get(&s.dir)?.get(&s.name).copied()
    }

    /// Removes `obj` and, for a directory, everything below it.
    fn drop_subtree(&mut self, obj: Obj) {
        if let Some(entries) = self.dirs.remove(&obj) {
            for (_, c) in entries {
                self.drop_subtree(c);
            }
        }
    }

    /// Every object reachable from the root, with every name it has.
    fn names(&self) -> BTreeMap<Obj, BTreeSet<Spot>> {
        let mut out: BTreeMap<Obj, BTreeSet<Spot>> = BTreeMap::new();
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            for (name, &o) in &self.dirs[&d] {
                out.entry(o).or_default().insert(Spot {
                    dir: d,
                    name: name.clone(),
                });
                if self.is_dir(o) {
                    todo.push(o);
                }
            }
        }
        out
    }

    /// Directories reachable from the root, parents first.
    fn dirs_top_down(&self) -> Vec<Obj> {
        let mut out = vec![ROOT];
        let mut i = 0;
        while i < out.len() {
            let d = out[i];
            for &o in self.dirs[&d].values() {
                if self.is_dir(o) {
                    out.push(o);
                }
            }
            i += 1;
        }
        out
    }

    /// The tree as nested names, for comparing two trees by shape and by
    /// which object each name holds.
    fn shape(&self, d: Obj) -> Vec<Shape> {
        self.dirs[&d]
            .iter()
            .map(|(name, &o)| {
                let inner = if self.is_dir(o) {
                    self.shape(o)
                        .into_iter()
                        .map(|(n, o, c)| (n, o, c.len()))
                        .collect()
                } else {
                    Vec::new()
                };
                (name.clone(), o, inner)
            })
            .collect()
    }

    fn same_as(&self, other: &Tree) -> bool {
        let mine = self.names();
        let theirs = other.names();
        mine == theirs
            && mine.keys().all(|o| self.is_dir(*o) == other.is_dir(*o))
            && self.shape(ROOT) == other.shape(ROOT)
    }
}

/// The cache, the model home, and what the cache's servers keep.
struct World {
    cache: Tree,
    home: Tree,
    /// Where home has each object (the owner's location record).
    home_at: BTreeMap<Obj, Spot>,
    /// Names that left each directory since its last push (the
    /// directory owner's departure records).
    departed: BTreeMap<Obj, BTreeMap<Vec<u8>, Obj>>,
    next: Obj,
    rng: StdRng,
    /// Objects created at home again because home had lost them (a
    /// directory removed at home before an object moved out of it was
    /// moved there).
    recreated: usize,
}

impl World {
    fn new(seed: u64) -> World {
        World {
            cache: Tree::new(),
            home: Tree::new(),
            home_at: BTreeMap::new(),
            departed: BTreeMap::new(),
            next: 100,
            rng: StdRng::seed_from_u64(seed),
            recreated: 0,
        }
    }

    fn name(&mut self) -> Vec<u8> {
        // Few names, so that they collide.
        format!("n{}", self.rng.gen_range(0..6)).into_bytes()
    }

    fn any_dir(&mut self) -> Obj {
        let dirs = self.cache.dirs_top_down();
        dirs[self.rng.gen_range(0..dirs.len())]
    }

    fn any_entry(&mut self) -> Option<Spot> {
        let d = self.any_dir();
        let names: Vec<Vec<u8>> = self.cache.dirs[&d].keys().cloned().collect();
        if names.is_empty() {
            return None;
        }
        let name = names[self.rng.gen_range(0..names.len())].clone();
        Some(Spot { dir: d, name })
    }

    fn depart(&mut self, s: &Spot, obj: Obj) {
        self.departed
            .entry(s.dir)
            .or_default()
            .entry(s.name.clone())
            .or_insert(obj);
    }

    /// Whether `anc` is `d` or above it in the cache.
    fn above(&self, anc: Obj, d: Obj) -> bool {
        if anc == d {
            return true;
        }
        let mut todo = vec![anc];
        while let Some(x) = todo.pop() {
            for &o in self.cache.dirs.get(&x).into_iter().flat_map(|m| m.values()) {
                if o == d {
                    return true;
                }
                if self.cache.is_dir(o) {
                    todo.push(o);
                }
            }
        }
        false
    }

    /// One random change in the cache.
    fn change(&mut self) {
        match self.rng.gen_range(0..10) {
            0..=2 => {
                let d = self.any_dir();
                let name = self.name();
                if self.cache.dirs[&d].contains_key(&name) {
                    return;
                }
                let o = self.next;
                self.next += 1;
                if self.rng.gen_bool(0.3) {
                    self.cache.dirs.insert(o, BTreeMap::new());
                }
                self.cache.dirs.get_mut(&d).map(|m| m.insert(name, o));
            }
            3 | 4 => {
                // unlink, rmdir, or rm -r
                let Some(s) = self.any_entry() else { return };
                let Some(o) = self.cache.get(&s) else { return };
                self.cache.dirs.get_mut(&s.dir).map(|m| m.remove(&s.name));
                self.depart(&s, o);
                if self.cache.is_dir(o) {
                    self.cache.drop_subtree(o);
                }
            }
            5..=8 => {
                // rename, over a file or an empty directory of the same kind
                let Some(from) = self.any_entry() else { return };
                let Some(o) = self.cache.get(&from) else {
                    return;
                };
                let to = Spot {
                    dir: self.any_dir(),
                    name: self.name(),
                };
                if to == from || (self.cache.is_dir(o) && self.above(o, to.dir)) {
                    return;
                }
                if let Some(old) = self.cache.get(&to) {
                    let both_dirs = self.cache.is_dir(old) && self.cache.is_dir(o);
                    let both_files = !self.cache.is_dir(old) && !self.cache.is_dir(o);
                    let empty = self.cache.dirs.get(&old).is_none_or(|m| m.is_empty());
                    if !(both_files || (both_dirs && empty)) || old == o {
                        return;
                    }
                    self.depart(&to, old);
                    self.cache.dirs.remove(&old);
                }
                self.cache
                    .dirs
                    .get_mut(&from.dir)
                    .map(|m| m.remove(&from.name));
                self.depart(&from, o);
                self.cache
                    .dirs
                    .get_mut(&to.dir)
                    .map(|m| m.insert(to.name.clone(), o));
            }
            _ => {
                // hard link of a file
                let Some(from) = self.any_entry() else { return };
                let Some(o) = self.cache.get(&from) else {
                    return;
                };
                if self.cache.is_dir(o) {
                    return;
                }
                let to = Spot {
                    dir: self.any_dir(),
                    name: self.name(),
                };
                if self.cache.get(&to).is_some() {
                    return;
                }
                self.cache
                    .dirs
                    .get_mut(&to.dir)
                    .map(|m| m.insert(to.name, o));
            }
        }
    }

    /// The inputs of directory `d`'s reconciliation, as its owner would
    /// gather them.
    fn sides(&self, d: Obj) -> (Vec<Named>, Vec<AtHome>) {
        let names = self.cache.names();
        let cache: Vec<Named> = self.cache.dirs[&d]
            .iter()
            .map(|(name, &o)| {
                let home_at = self.home_at.get(&o).cloned();
                let still_there = home_at
                    .as_ref()
                    .is_some_and(|s| self.cache.get(s) == Some(o));
                Named {
                    name: name.clone(),
                    obj: o,
                    home_at,
                    still_there,
                }
            })
            .collect();
        let home: Vec<AtHome> = self.home.dirs[&d]
            .iter()
            .map(|(name, &h)| {
                // The owner compares home's file id with the one the
                // entry's object records; here home's objects are the
                // cache's ids.
                let same = self.cache.dirs[&d].get(name).copied().filter(|&o| o == h);
                let departed = self.departed.get(&d).and_then(|m| m.get(name)).copied();
                let obj = identify(name, same, departed);
                if let Some(o) = obj {
                    // What the owner assumes (single writer): home's entry
                    // is the object the cache last had there.
                    assert_eq!(o, h, "home's {name:?} in {d} taken for {o}, is {h}");
                }
                let here = Spot {
                    dir: d,
                    name: name.clone(),
                };
                let moving = obj.is_some_and(|o| {
                    names.contains_key(&o)
                        && self.home_at.get(&o) == Some(&here)
                        && self.cache.get(&here) != Some(o)
                });
                AtHome {
                    name: name.clone(),
                    is_dir: self.home.is_dir(h),
                    obj,
                    moving,
                }
            })
            .collect();
        (cache, home)
    }

    /// Runs one step at the model home, as the executor would: a move whose
    /// source home lost (removed with its directory) makes the object anew.
    fn run(&mut self, d: Obj, step: &Step) {
        match step {
            Step::Aside { name, temp, obj } => {
                let o = self.home.dirs.get_mut(&d).and_then(|m| m.remove(name));
                assert_eq!(o, Some(*obj));
                assert!(!self.home.dirs[&d].contains_key(temp), "aside over a name");
                self.home
                    .dirs
                    .get_mut(&d)
                    .map(|m| m.insert(temp.clone(), *obj));
                self.home_at.insert(
                    *obj,
                    Spot {
                        dir: d,
                        name: temp.clone(),
                    },
                );
            }
            Step::Unlink { at, obj, now_at } => {
                assert_eq!(self.home.get(now_at), Some(*obj), "unlink of its last name");
                // A name already gone (a replay) is not an error.
                if self.home.get(at) == Some(*obj) {
                    self.home.dirs.get_mut(&at.dir).map(|m| m.remove(&at.name));
                }
                if self.home_at.get(obj) == Some(at) {
                    self.home_at.insert(*obj, now_at.clone());
                }
            }
            Step::Remove { name, .. } => {
                let o = self.home.dirs.get_mut(&d).and_then(|m| m.remove(name));
                if let Some(o) = o {
                    if !self.home.names().contains_key(&o) {
                        self.home.drop_subtree(o);
                    }
                }
            }
            Step::Rename { obj, from, name } => {
                assert!(!self.home.dirs[&d].contains_key(name), "rename over a name");
                if self.home.get(from) == Some(*obj) {
                    self.home
                        .dirs
                        .get_mut(&from.dir)
                        .map(|m| m.remove(&from.name));
                    self.home
                        .dirs
                        .get_mut(&d)
                        .map(|m| m.insert(name.clone(), *obj));
                    self.home_at.insert(
                        *obj,
                        Spot {
                            dir: d,
                            name: name.clone(),
                        },
                    );
                } else {
                    self.create(d, *obj, name);
                }
            }
            Step::Link { obj, from, name } => {
                assert!(!self.home.dirs[&d].contains_key(name), "link over a name");
                if self.home.get(from) == Some(*obj) {
                    self.home
                        .dirs
                        .get_mut(&d)
                        .map(|m| m.insert(name.clone(), *obj));
                } else {
                    self.create(d, *obj, name);
                }
            }
            Step::Create { obj, name } => self.create(d, *obj, name),
        }
    }

    fn create(&mut self, d: Obj, obj: Obj, name: &[u8]) {
        assert!(!self.home.dirs[&d].contains_key(name), "create over a name");
        if self.home.names().contains_key(&obj) {
            self.recreated += 1;
        }
        if self.cache.is_dir(obj) {
            // A directory made anew at home is empty; its own
            // reconciliation fills it.
            self.home.drop_subtree(obj);
            self.home.dirs.insert(obj, BTreeMap::new());
        }
        self.home
            .dirs
            .get_mut(&d)
            .map(|m| m.insert(name.to_vec(), obj));
        self.home_at.insert(
            obj,
            Spot {
                dir: d,
                name: name.to_vec(),
            },
        );
    }

    /// Reconciles every directory, parents first; with `crash`, stops one
    /// directory's steps partway at random (its departure records stay).
    /// Returns the steps run.
    fn reconcile(&mut self, crash: bool) -> usize {
        let mut ran = 0;
        for d in self.cache.dirs_top_down() {
            if !self.home.dirs.contains_key(&d) {
                // Not at home yet (its parent's push did not get there):
                // it waits for the next round, marks and all.
                continue;
            }
            let (cache, home) = self.sides(d);
            let steps = plan(d, &cache, &home, false);
            if std::env::var("WB_TRACE").is_ok() && !steps.is_empty() {
                eprintln!("dir {d}: cache {cache:?}\n  home {home:?}\n  steps {steps:?}");
            }
            let stop = if crash && !steps.is_empty() && self.rng.gen_bool(0.3) {
                self.rng.gen_range(0..steps.len())
            } else {
                steps.len()
            };
            for s in &steps[..stop] {
                self.run(d, s);
                ran += 1;
            }
            if stop < steps.len() {
                // The server crashed: nothing more this round.
                return ran;
            }
            self.departed.remove(&d);
        }
        ran
    }
}

#[test]
fn reconciling_from_the_top_makes_home_equal_the_cache() {
    let mut recreated = 0;
    let only: Option<u64> = std::env::var("WB_SEED").ok().and_then(|s| s.parse().ok());
    for seed in 0..400 {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        let mut w = World::new(seed);
        // A tree, pushed whole.
        for _ in 0..30 {
            w.change();
        }
        w.departed.clear();
        w.reconcile(false);
        assert!(w.home.same_as(&w.cache), "seed {seed}: first push");
        // Changes, then pushes cut short by crashes, then a whole one.
        for round in 0..4 {
            for _ in 0..w.rng.gen_range(1..25) {
                w.change();
            }
            let crash = round % 2 == 0;
            w.reconcile(crash);
            if crash {
                w.reconcile(true);
            }
            w.reconcile(false);
            assert!(
                w.home.same_as(&w.cache),
                "seed {seed} round {round}: home {:?}\ncache {:?}",
                w.home.shape(ROOT),
                w.cache.shape(ROOT)
            );
            assert_eq!(
                w.reconcile(false),
                0,
                "seed {seed}: a second push did something"
            );
        }
        recreated += w.recreated;
    }
    // Moves out of a directory removed at home before them make the object
    // anew (its data pushed again): it happens, and stays rare.
    eprintln!("objects made anew at home: {recreated}");
}
