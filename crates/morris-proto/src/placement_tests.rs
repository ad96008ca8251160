//! Per-file server lists against today's layout, and the add and drain
//! plans: balanced after, moving no more than they must, copies apart.

use super::*;
use crate::layout::Layout;

const MIB: u64 = 1 << 20;

/// A small deterministic generator (xorshift), for test data only.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `n` files on `k` members with today's lists, sizes up to `max` bytes.
fn volume(n: u64, k: u32, max: u64, seed: u64) -> Vec<FileUse> {
    let mut g = Gen(seed);
    (0..n)
        .map(|j| FileUse {
            id: 2 * u64::from(k) + j * 7 + (g.next() % 5),
            size: g.next() % max,
            unit: MIB as u32,
            servers: FileServers::identity(k),
        })
        .collect()
}

/// Largest and smallest member's bytes over the mean.
fn spread(files: &[FileUse], replicas: u32, members: &[u32]) -> (f64, f64) {
    let have = bytes_by_member(files, replicas);
    let v: Vec<f64> = members
        .iter()
        .map(|m| have.get(m).copied().unwrap_or(0) as f64)
        .collect();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let max = v.iter().cloned().fold(f64::MIN, f64::max);
    let min = v.iter().cloned().fold(f64::MAX, f64::min);
    (max / mean, min / mean)
}

fn total(files: &[FileUse], replicas: u32) -> u64 {
    bytes_by_member(files, replicas).values().sum()
}

#[test]
fn the_identity_list_is_todays_placement() {
    for k in 1..=6u32 {
        for r in 1..=k.min(3) {
            let l = Layout::new(k, 4096, r);
            let f = FileServers::identity(k);
            f.check(r).unwrap();
            for id in 0..20u64 {
                for i in 0..40u64 {
                    for rep in 0..r {
                        assert_eq!(f.server(id, i, rep), l.replica_server(id, i, rep));
                    }
                }
            }
            for p in 0..k {
                assert_eq!(f.extent_set(p), 0);
            }
        }
    }
}

#[test]
fn blocks_at_a_position_match_counting() {
    for w in 1..=5u32 {
        let f = FileServers((0..w).collect());
        for id in 0..8u64 {
            for size in 0..(12 * 16u64) {
                for p in 0..w {
                    let want = (1..=size.div_ceil(16))
                        .filter(|&i| f.position(id, i, 0) == p)
                        .count() as u64;
                    assert_eq!(
                        f.blocks_at(id, p, size, 16),
                        want,
                        "w {w} id {id} size {size}"
                    );
                }
            }
        }
    }
}

#[test]
fn copies_of_a_block_must_sit_on_distinct_members() {
    assert!(FileServers::new(vec![], 1).is_err());
    assert!(FileServers::new(vec![0, 1, 0, 1], 2).is_ok());
    assert_eq!(
        FileServers::new(vec![0, 0, 1], 2),
        Err(PlacementError::CopiesTogether {
            member: 0,
            first: 0,
            second: 1
        })
    );
    // Round the list: the last position's copy is at position 0.
    assert!(FileServers::new(vec![0, 1, 2, 0], 2).is_err());
    assert!(FileServers::new(vec![0, 1, 2, 0, 1, 2], 3).is_ok());
    assert!(FileServers::new(vec![0, 1], 3).is_err());
    // A member's second position keeps its blocks apart from its first.
    let f = FileServers::new(vec![0, 1, 2, 1], 2).unwrap();
    assert_eq!(
        (0..4).map(|p| f.extent_set(p)).collect::<Vec<_>>(),
        vec![0, 0, 0, 1]
    );
}

#[test]
fn adding_a_member_moves_its_share_and_no_more() {
    for replicas in 1..=2u32 {
        let files = volume(2_000, 4, 300 * MIB, 7 + u64::from(replicas));
        let all = total(&files, replicas);
        let members = [0, 1, 2, 3, 4];
        let moves = plan_add(&files, replicas, &members, 4);
        let after = apply(&files, &moves);
        for f in &after {
            f.servers.check(replicas).unwrap();
        }
        let moved: u64 = moves.iter().map(|m| m.bytes).sum();
        let share = all as f64 / 5.0;
        assert!(
            (moved as f64) <= share * 1.02 && (moved as f64) >= share * 0.95,
            "moved {moved} of {all} (replicas {replicas})"
        );
        assert!(moves.iter().all(|m| m.to == 4));
        // At most one position of a file moves.
        let mut ids: Vec<u64> = moves.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), moves.len());
        let (hi, lo) = spread(&after, replicas, &members);
        assert!(hi <= 1.10 && lo >= 0.90, "spread {hi:.3} {lo:.3}");
        assert_eq!(total(&after, replicas), all, "nothing lost or doubled");
    }
}

#[test]
fn a_few_big_files_are_balanced_too() {
    // Ten 1 GiB files (a BLAST database's volumes) on 4 members, a 5th added.
    let files: Vec<FileUse> = (0..10u64)
        .map(|j| FileUse {
            id: 8 + j,
            size: 1024 * MIB,
            unit: MIB as u32,
            servers: FileServers::identity(4),
        })
        .collect();
    let members = [0, 1, 2, 3, 4];
    let after = apply(&files, &plan_add(&files, 1, &members, 4));
    let (hi, lo) = spread(&after, 1, &members);
    assert!(hi <= 1.10 && lo >= 0.90, "spread {hi:.3} {lo:.3}");
}

#[test]
fn members_added_one_after_another_stay_balanced() {
    let mut files = volume(3_000, 4, 100 * MIB, 3);
    let mut members: Vec<u32> = (0..4).collect();
    for new in 4..8u32 {
        members.push(new);
        let moves = plan_add(&files, 2, &members, new);
        files = apply(&files, &moves);
        let (hi, lo) = spread(&files, 2, &members);
        assert!(
            hi <= 1.10 && lo >= 0.90,
            "{} members: {hi:.3} {lo:.3}",
            members.len()
        );
        for f in &files {
            f.servers.check(2).unwrap();
        }
    }
}

#[test]
fn draining_a_member_moves_what_it_held_and_evens_out_the_rest() {
    for replicas in 1..=2u32 {
        let files = volume(2_000, 5, 200 * MIB, 11);
        let held = bytes_by_member(&files, replicas)
            .get(&2)
            .copied()
            .unwrap_or(0);
        let remaining = [0, 1, 3, 4];
        let moves = plan_drain(&files, replicas, &remaining, 2).unwrap();
        let moved: u64 = moves.iter().map(|m| m.bytes).sum();
        if replicas == 1 {
            assert_eq!(moved, held);
        } else {
            // Copies kept apart send the drained bytes to the members not
            // next to it; evening that out moves half as much again.
            assert!(
                moved >= held && (moved as f64) <= held as f64 * 1.6,
                "moved {moved}, held {held}"
            );
        }
        let after = apply(&files, &moves);
        for f in &after {
            assert!(!f.servers.members().contains(&2));
            f.servers.check(replicas).unwrap();
        }
        let (hi, lo) = spread(&after, replicas, &remaining);
        assert!(hi <= 1.10 && lo >= 0.90, "spread {hi:.3} {lo:.3}");
    }
}

#[test]
fn a_drained_file_as_wide_as_the_volume_keeps_its_copies_apart() {
    // Every member is in the list already: the drained position goes to a
    // member far enough from it, which then holds two positions.
    let files = vec![FileUse {
        id: 9,
        size: 40 * MIB,
        unit: MIB as u32,
        servers: FileServers::identity(4),
    }];
    let moves = plan_drain(&files, 2, &[0, 1, 2], 3).unwrap();
    let after = apply(&files, &moves);
    let l = &after[0].servers;
    l.check(2).unwrap();
    assert_eq!(l.members(), &[0, 1, 2, 1]);
    assert_eq!(l.extent_set(3), 1);
    // Two copies need two members.
    assert_eq!(
        plan_drain(&after, 2, &[0], 1),
        Err(PlacementError::TooFewMembers {
            members: 1,
            replicas: 2
        })
    );
    // Three copies on three members: no position can take a 4th list's
    // drained place next to two others.
    let three = vec![FileUse {
        servers: FileServers::identity(4),
        ..files[0].clone()
    }];
    assert!(plan_drain(&three, 3, &[0, 1, 2], 3).is_err());
}

#[test]
fn empty_files_move_off_a_drained_member_but_never_for_balance() {
    let files = vec![
        FileUse {
            id: 10,
            size: 0,
            unit: MIB as u32,
            servers: FileServers::identity(3),
        },
        FileUse {
            id: 11,
            size: 30 * MIB,
            unit: MIB as u32,
            servers: FileServers::identity(3),
        },
    ];
    let add = plan_add(&files, 1, &[0, 1, 2, 3], 3);
    assert!(add.iter().all(|m| m.id == 11));
    let drain = plan_drain(&files, 1, &[0, 1], 2).unwrap();
    assert!(drain.iter().any(|m| m.id == 10 && m.bytes == 0));
}

#[test]
fn a_file_layout_with_the_identity_list_is_the_volume_layout() {
    for k in 1..=5u32 {
        for r in 1..=k.min(3) {
            let l = Layout::new(k, 16, r);
            for id in 0..8u64 {
                let f = FileLayout::new(&l, id, None);
                for i in 1..=30u64 {
                    assert_eq!(f.placement(i), l.placement(id, i));
                    assert_eq!(f.local_offset(i), l.local_offset(i));
                }
                for s in 0..k {
                    for rep in 0..r {
                        let e: Vec<Extent> = f
                            .extents_of(s)
                            .into_iter()
                            .filter(|e| e.copy == rep)
                            .collect();
                        assert_eq!(e.len(), 1);
                        assert_eq!(e[0].set, 0);
                        for size in 0..100u64 {
                            assert_eq!(
                                f.local_len(e[0].base, size),
                                l.replica_local_len(id, s, rep, size)
                            );
                        }
                    }
                    for from in 0..100u64 {
                        assert_eq!(f.local_start(s, from), l.local_start(id, s, from));
                    }
                    for local in 0..64u64 {
                        assert_eq!(f.global_of_local(s, local), l.global_of_local(id, s, local));
                    }
                }
            }
        }
    }
}

#[test]
fn every_block_copy_has_one_slot_in_one_extent_of_its_member() {
    // Lists with a member twice (far enough apart for the copies).
    let lists: [(&[u32], u32); 4] = [
        (&[0, 1, 2, 1], 2),
        (&[3, 0, 3, 1, 2], 1),
        (&[0, 1, 2, 0, 1, 2], 3),
        (&[4, 2], 2),
    ];
    for (list, replicas) in lists {
        let servers = FileServers::new(list.to_vec(), replicas).unwrap();
        let l = Layout::new(8, 16, replicas);
        for id in 0..7u64 {
            let f = FileLayout::new(&l, id, Some(&servers));
            // (member, set, copy) -> slots used, in block order.
            let mut slots: BTreeMap<(u32, u32, u32), Vec<u64>> = BTreeMap::new();
            for i in 1..=60u64 {
                let members = f.placement(i);
                let mut d = members.clone();
                d.sort_unstable();
                d.dedup();
                assert_eq!(
                    d.len(),
                    members.len(),
                    "copies apart: {list:?} id {id} block {i}"
                );
                for rep in 0..replicas {
                    let e = f.extent_of(i, rep);
                    let m = f.server(i, rep);
                    assert!(f.extents_of(m).contains(&e));
                    slots
                        .entry((m, e.set, rep))
                        .or_default()
                        .push(f.local_offset(i) / 16);
                    // The extent's own arithmetic finds the block again.
                    assert_eq!(
                        f.global_of_local(e.base, f.local_offset(i) + 3),
                        (i - 1) * 16 + 3
                    );
                }
            }
            for (key, v) in &slots {
                let want: Vec<u64> = (0..v.len() as u64).collect();
                assert_eq!(v, &want, "{list:?} id {id} extent {key:?}: dense, in order");
            }
            // Lengths against the definition.
            for m in list {
                for e in f.extents_of(*m) {
                    for size in 0..130u64 {
                        let mut want = 0;
                        for off in 0..size {
                            let i = off / 16 + 1;
                            if f.extent_of(i, e.copy) == e {
                                want = want.max(f.local_offset(i) + off % 16 + 1);
                            }
                        }
                        assert_eq!(f.local_len(e.base, size), want, "{list:?} id {id} {e:?}");
                    }
                }
            }
        }
    }
}
