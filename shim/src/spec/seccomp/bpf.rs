//! Classic BPF for seccomp: rules per system call number, each a list of argument conditions
//! and an action, turned into the program the kernel runs on every system call.
//!
//! ```text
//! ld arch; not x86_64 -> ret foreign     (i386 and x32 calls have other numbers)
//! ld nr;   x32 bit set -> ret foreign
//! jeq nr_1 ? ja block_1 : next           (one pair per system call with rules)
//! ...
//! ret default
//! block_n: rule 1: conditions (any fails: go to rule 2), ret action
//!          rule 2: ...
//!          ret default
//! ```
//!
//! Arguments are 64 bits; classic BPF compares 32, so every condition looks at the high
//! word, then the low one.

use std::collections::BTreeMap;

const LD_W_ABS: u16 = 0x20;
const ALU_AND_K: u16 = 0x54;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGT_K: u16 = 0x25;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;

/// `struct seccomp_data` offsets.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const ARGS_OFFSET: u32 = 16;
/// `AUDIT_ARCH_X86_64`.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `BPF_MAXINSNS`.
pub const MAX_INSNS: usize = 4096;

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// How an argument is compared (`SCMP_CMP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `arg & mask == value`.
    MaskedEq(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Condition {
    pub arg: u8,
    pub op: Op,
    pub value: u64,
}

/// Conditions that must all hold for `action` (a `SECCOMP_RET_*` value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub conditions: Vec<Condition>,
    pub action: u32,
}

/// Where a conditional jump goes: on to the next instruction, past the condition (it
/// holds), or to the next rule (it fails).
#[derive(Clone, Copy)]
enum To {
    Next,
    Pass,
    Fail,
}

enum Step {
    Plain(Insn),
    Jump { code: u16, k: u32, jt: To, jf: To },
}

fn insn(code: u16, k: u32) -> Insn {
    Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn load(offset: u32) -> Step {
    Step::Plain(insn(LD_W_ABS, offset))
}

fn jump(code: u16, k: u32, jt: To, jf: To) -> Step {
    Step::Jump { code, k, jt, jf }
}

/// The steps of one condition: high word first, then low word.
fn condition_steps(c: &Condition) -> Vec<Step> {
    let lo_offset = ARGS_OFFSET + 8 * u32::from(c.arg);
    let (hi, lo) = (lo_offset + 4, lo_offset);
    let (vh, vl) = ((c.value >> 32) as u32, c.value as u32);
    use To::*;
    match c.op {
        Op::Eq => vec![
            load(hi),
            jump(JEQ_K, vh, Next, Fail),
            load(lo),
            jump(JEQ_K, vl, Next, Fail),
        ],
        Op::Ne => vec![
            load(hi),
            jump(JEQ_K, vh, Next, Pass),
            load(lo),
            jump(JEQ_K, vl, Fail, Next),
        ],
        Op::Gt | Op::Ge => vec![
            load(hi),
            jump(JGT_K, vh, Pass, Next),
            jump(JEQ_K, vh, Next, Fail),
            load(lo),
            jump(if c.op == Op::Gt { JGT_K } else { JGE_K }, vl, Next, Fail),
        ],
        // Lt is "not Ge", Le is "not Gt".
        Op::Lt | Op::Le => vec![
            load(hi),
            jump(JGT_K, vh, Fail, Next),
            jump(JEQ_K, vh, Next, Pass),
            load(lo),
            jump(if c.op == Op::Le { JGT_K } else { JGE_K }, vl, Fail, Next),
        ],
        Op::MaskedEq(mask) => vec![
            load(hi),
            Step::Plain(insn(ALU_AND_K, (mask >> 32) as u32)),
            jump(JEQ_K, vh, Next, Fail),
            load(lo),
            Step::Plain(insn(ALU_AND_K, mask as u32)),
            jump(JEQ_K, vl, Next, Fail),
        ],
    }
}

/// A rule: its conditions, then its action; a failed condition jumps past the action.
fn rule_insns(rule: &Rule) -> Result<Vec<Insn>, String> {
    let conditions: Vec<Vec<Step>> = rule.conditions.iter().map(condition_steps).collect();
    let len: usize = conditions.iter().map(Vec::len).sum::<usize>() + 1;
    let mut out = Vec::with_capacity(len);
    for steps in &conditions {
        let end = out.len() + steps.len();
        for step in steps {
            let here = out.len();
            let offset = |to: To| -> Result<u8, String> {
                let target = match to {
                    To::Next => here + 1,
                    To::Pass => end,
                    To::Fail => len,
                };
                u8::try_from(target - here - 1)
                    .map_err(|_| "a rule with too many conditions".to_string())
            };
            out.push(match *step {
                Step::Plain(i) => i,
                Step::Jump { code, k, jt, jf } => Insn {
                    code,
                    jt: offset(jt)?,
                    jf: offset(jf)?,
                    k,
                },
            });
        }
    }
    out.push(insn(RET_K, rule.action));
    Ok(out)
}

/// The whole program. `foreign` is the action for calls of another architecture (or the
/// x32 ABI), `default` for calls no rule matches.
pub fn program(
    rules: &BTreeMap<u32, Vec<Rule>>,
    default: u32,
    foreign: u32,
) -> Result<Vec<Insn>, String> {
    let mut blocks = Vec::new();
    for list in rules.values() {
        let mut block = Vec::new();
        for rule in list {
            block.extend(rule_insns(rule)?);
        }
        block.push(insn(RET_K, default));
        blocks.push(block);
    }
    let mut out = vec![
        insn(LD_W_ABS, ARCH_OFFSET),
        Insn {
            jt: 1,
            ..insn(JEQ_K, AUDIT_ARCH_X86_64)
        },
        insn(RET_K, foreign),
        insn(LD_W_ABS, NR_OFFSET),
        Insn {
            jf: 1,
            ..insn(JGE_K, X32_SYSCALL_BIT)
        },
        insn(RET_K, foreign),
    ];
    // After the dispatch pairs and the default return come the blocks.
    let mut block_at = out.len() + 2 * rules.len() + 1;
    for (nr, block) in rules.keys().zip(&blocks) {
        out.push(Insn {
            jf: 1,
            ..insn(JEQ_K, *nr)
        });
        let here = out.len();
        out.push(insn(JA, (block_at - here - 1) as u32));
        block_at += block.len();
    }
    out.push(insn(RET_K, default));
    for block in blocks {
        out.extend(block);
    }
    if out.len() > MAX_INSNS {
        return Err(format!(
            "the filter needs {} instructions, more than the kernel's {MAX_INSNS}",
            out.len()
        ));
    }
    Ok(out)
}

/// The program as the bytes of a `struct sock_filter` array (native byte order).
pub fn to_bytes(program: &[Insn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for i in program {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
pub mod interpreter {
    //! Runs a program on a `seccomp_data`, as the kernel would (for the tests).
    use super::*;

    pub fn run(program: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let word = |offset: u32| -> u32 {
            match offset {
                NR_OFFSET => nr,
                ARCH_OFFSET => arch,
                o if (ARGS_OFFSET..ARGS_OFFSET + 48).contains(&o) => {
                    let arg = args[((o - ARGS_OFFSET) / 8) as usize];
                    if (o - ARGS_OFFSET).is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = program[pc];
            pc += 1;
            let taken = match i.code {
                LD_W_ABS => {
                    a = word(i.k);
                    continue;
                }
                ALU_AND_K => {
                    a &= i.k;
                    continue;
                }
                RET_K => return i.k,
                JA => {
                    pc += i.k as usize;
                    continue;
                }
                JEQ_K => a == i.k,
                JGT_K => a > i.k,
                JGE_K => a >= i.k,
                c => panic!("opcode {c:#x}"),
            };
            pc += usize::from(if taken { i.jt } else { i.jf });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::interpreter::run;
    use super::*;

    const ALLOW: u32 = 0x7fff_0000;
    const DENY: u32 = 0x0005_0001;
    const FOREIGN: u32 = 0x0005_0026;

    fn one(op: Op, value: u64) -> Vec<Insn> {
        let rules = BTreeMap::from([(
            7,
            vec![Rule {
                conditions: vec![Condition { arg: 2, op, value }],
                action: ALLOW,
            }],
        )]);
        program(&rules, DENY, FOREIGN).unwrap()
    }

    fn with_arg(p: &[Insn], arg: u64) -> bool {
        run(p, AUDIT_ARCH_X86_64, 7, [0, 0, arg, 0, 0, 0]) == ALLOW
    }

    #[test]
    fn comparisons_across_both_words() {
        let values = [
            0,
            1,
            0xffff_ffff,
            0x1_0000_0000,
            0x1_0000_0001,
            0x2_0000_0000,
            u64::MAX,
        ];
        for &v in &values {
            for &arg in &values {
                let cases: [(Op, bool); 6] = [
                    (Op::Eq, arg == v),
                    (Op::Ne, arg != v),
                    (Op::Lt, arg < v),
                    (Op::Le, arg <= v),
                    (Op::Gt, arg > v),
                    (Op::Ge, arg >= v),
                ];
                for (op, want) in cases {
                    assert_eq!(with_arg(&one(op, v), arg), want, "{arg:#x} {op:?} {v:#x}");
                }
            }
        }
        let masked = one(Op::MaskedEq(0x1_0000_00ff), 0x1_0000_0011);
        assert!(with_arg(&masked, 0x1_ffff_ff11));
        assert!(!with_arg(&masked, 0x0_ffff_ff11));
        assert!(!with_arg(&masked, 0x1_0000_0012));
    }

    #[test]
    fn rules_in_order_then_default_and_other_architectures() {
        let rules = BTreeMap::from([
            (
                1,
                vec![
                    Rule {
                        conditions: vec![Condition {
                            arg: 0,
                            op: Op::Eq,
                            value: 5,
                        }],
                        action: 0x0005_0009,
                    },
                    Rule {
                        conditions: vec![],
                        action: ALLOW,
                    },
                ],
            ),
            (
                300,
                vec![Rule {
                    conditions: vec![
                        Condition {
                            arg: 0,
                            op: Op::Eq,
                            value: 1,
                        },
                        Condition {
                            arg: 1,
                            op: Op::Eq,
                            value: 2,
                        },
                    ],
                    action: ALLOW,
                }],
            ),
        ]);
        let p = program(&rules, DENY, FOREIGN).unwrap();
        let x86 = AUDIT_ARCH_X86_64;
        assert_eq!(run(&p, x86, 1, [5, 0, 0, 0, 0, 0]), 0x0005_0009);
        assert_eq!(run(&p, x86, 1, [6, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&p, x86, 300, [1, 2, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&p, x86, 300, [1, 3, 0, 0, 0, 0]), DENY);
        assert_eq!(run(&p, x86, 2, [0; 6]), DENY);
        assert_eq!(run(&p, 0x4000_0003, 1, [6, 0, 0, 0, 0, 0]), FOREIGN);
        assert_eq!(
            run(&p, x86, X32_SYSCALL_BIT | 1, [6, 0, 0, 0, 0, 0]),
            FOREIGN
        );
        assert_eq!(to_bytes(&p).len(), p.len() * 8);
    }

    #[test]
    fn too_long_a_program_is_refused() {
        let rules: BTreeMap<u32, Vec<Rule>> = (0..3000)
            .map(|nr| {
                (
                    nr,
                    vec![Rule {
                        conditions: vec![],
                        action: ALLOW,
                    }],
                )
            })
            .collect();
        let err = program(&rules, DENY, FOREIGN).unwrap_err();
        assert!(err.contains("4096"), "{err}");
    }
}
