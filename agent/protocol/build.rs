use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    Codegen::new()
        .out_dir(&out)
        .inputs(["protos/agent.proto"])
        .include("protos")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .expect("ttrpc codegen of protos/agent.proto");
    // The generated files carry inner attributes and docs, which `include!` cannot take.
    for name in ["agent.rs", "agent_ttrpc.rs"] {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path).expect("read generated code");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .collect();
        std::fs::write(&path, kept.join("\n")).expect("write generated code");
    }
    println!("cargo:rerun-if-changed=protos/agent.proto");
}
