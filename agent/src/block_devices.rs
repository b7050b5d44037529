//! Block devices the shim hot-plugged for a container: the agent loads the driver's modules,
//! waits until the kernel shows a disk with the device's serial in `/sys/block` (`vdX`,
//! `sdX` or `nvmeXnY`), and hands its numbers to the container init, which makes the node
//! at the spec's path.

use std::path::Path;
use std::time::{Duration, Instant};

use vmlet_protocol::agent::BlockDevice;

use crate::init_spec::DeviceNode;
use crate::Error;

/// How long a hot-plugged device may take to appear (ACPI hotplug under TCG is slow).
const APPEAR_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);
/// Mode of a node whose spec gives none.
const DEFAULT_MODE: u32 = 0o660;

/// Finds every device and returns the nodes to make, in the request's order.
pub async fn resolve(devices: &[BlockDevice]) -> Result<Vec<DeviceNode>, Error> {
    let mut drivers: Vec<&str> = devices.iter().map(|d| d.driver.as_str()).collect();
    drivers.sort_unstable();
    drivers.dedup();
    for driver in drivers {
        if !matches!(driver, "virtio" | "scsi" | "nvme") {
            return Err(Error::InvalidRequest(format!(
                "unknown disk driver {driver:?}"
            )));
        }
        crate::boot::load_modules(&crate::boot::driver_module_list(driver))?;
    }
    let mut nodes = Vec::new();
    for device in devices {
        let started = Instant::now();
        let (name, major, minor) = loop {
            if let Some(found) = find(Path::new("/sys/block"), &device.serial)? {
                break found;
            }
            if started.elapsed() > APPEAR_TIMEOUT {
                return Err(Error::DeviceTimeout(format!(
                    "{} disk with serial {} (for {}) did not appear in the guest within {} s",
                    device.driver,
                    device.serial,
                    device.path,
                    APPEAR_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(POLL).await;
        };
        log::info!(
            "block device {} is {name} ({major}:{minor}), {} ms after the request",
            device.serial,
            started.elapsed().as_millis()
        );
        nodes.push(DeviceNode {
            path: device.path.clone(),
            guest_name: name,
            major,
            minor,
            file_mode: if device.file_mode == 0 {
                DEFAULT_MODE
            } else {
                device.file_mode & 0o7777
            },
            uid: device.uid,
            gid: device.gid,
        });
    }
    Ok(nodes)
}

/// The disk under `sys_block` whose serial is `serial`: its name and device numbers.
pub fn find(sys_block: &Path, serial: &str) -> Result<Option<(String, u32, u32)>, Error> {
    let entries = std::fs::read_dir(sys_block)
        .map_err(|e| Error::io(format!("read {}", sys_block.display()), e))?;
    for entry in entries.flatten() {
        let dir = entry.path();
        if serial_of(&dir).as_deref() != Some(serial) {
            continue;
        }
        let dev = std::fs::read_to_string(dir.join("dev"))
            .map_err(|e| Error::io(format!("read {}/dev", dir.display()), e))?;
        let numbers = dev
            .trim()
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let Some((major, minor)) = numbers else {
            return Err(Error::Device(format!(
                "{}/dev is {dev:?}, not major:minor",
                dir.display()
            )));
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        return Ok(Some((name, major, minor)));
    }
    Ok(None)
}

/// A disk's serial as each driver shows it: virtio-blk in `serial`, NVMe in the
/// controller's (or subsystem's) `serial`, SCSI in the unit serial number VPD page.
fn serial_of(disk: &Path) -> Option<String> {
    let text = |name: &str| {
        std::fs::read_to_string(disk.join(name))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    text("serial")
        .or_else(|| text("device/serial"))
        .or_else(|| {
            std::fs::read(disk.join("device/vpd_pg80"))
                .ok()
                .and_then(|page| unit_serial(&page))
        })
        .filter(|s| !s.is_empty())
}

/// The serial in a SCSI VPD page 0x80: a 4-byte header (page code at 1, length at 2..4).
fn unit_serial(page: &[u8]) -> Option<String> {
    if page.len() < 4 || page[1] != 0x80 {
        return None;
    }
    let len = u16::from_be_bytes([page[2], page[3]]) as usize;
    let serial = page.get(4..4 + len)?;
    Some(
        String::from_utf8_lossy(serial)
            .trim_matches(|c: char| c == ' ' || c == '\0')
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(root: &Path, name: &str, file: &str, serial: &[u8], dev: &str) {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("device")).unwrap();
        std::fs::write(dir.join(file), serial).unwrap();
        std::fs::write(dir.join("dev"), dev).unwrap();
    }

    #[test]
    fn each_driver_shows_its_serial_where_the_kernel_puts_it() {
        let root = std::env::temp_dir().join(format!("vmlet-sysblock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        disk(&root, "vda", "serial", b"vmlet1\n", "254:0\n");
        disk(
            &root,
            "nvme0n1",
            "device/serial",
            b"vmlet2              \n",
            "259:0\n",
        );
        let mut page = vec![0x00, 0x80, 0x00, 0x08];
        page.extend_from_slice(b"vmlet3  ");
        disk(&root, "sda", "device/vpd_pg80", &page, "8:0\n");
        std::fs::create_dir_all(root.join("loop0")).unwrap();

        assert_eq!(find(&root, "vmlet1").unwrap(), Some(("vda".into(), 254, 0)));
        assert_eq!(
            find(&root, "vmlet2").unwrap(),
            Some(("nvme0n1".into(), 259, 0))
        );
        assert_eq!(find(&root, "vmlet3").unwrap(), Some(("sda".into(), 8, 0)));
        assert_eq!(find(&root, "vmlet4").unwrap(), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn vpd_pages_of_another_kind_or_too_short_give_no_serial() {
        assert_eq!(unit_serial(&[0, 0x83, 0, 2, b'a', b'b']), None);
        assert_eq!(unit_serial(&[0, 0x80, 0, 9, b'a']), None);
        assert_eq!(unit_serial(&[0, 0x80, 0, 2, b'a', b'b']), Some("ab".into()));
    }
}
