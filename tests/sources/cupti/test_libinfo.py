"""Which libcupti is loaded (sources/cupti/libinfo.py)."""

from graphmon.sources.cupti.libinfo import library_info


def test_library_info_names_the_loaded_libcupti_and_its_wheel(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcupti.so.13").write_bytes(b"")
    di = site / "nvidia_cuda_cupti-13.4.92.dist-info"
    di.mkdir()
    (di / "RECORD").write_text("nvidia/cu13/lib/libcupti.so.13,sha256=x,1\n")
    other = site / "nvidia_cuda_cupti-13.0.85.dist-info"  # a stale dist-info that does not list it
    other.mkdir()
    (other / "RECORD").write_text("nvidia/cu13/lib/libnvperf_host.so,sha256=x,1\n")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 123 {lib / 'libcupti.so.13'}\n"
        f"7f10-7f20 r--p 00010000 08:01 123 {lib / 'libcupti.so.13'}\n"
        "7f20-7f30 r-xp 00000000 08:01 456 /usr/lib/libc.so.6\n")
    info = library_info(str(maps))
    assert info["cupti_lib"] == str(lib / "libcupti.so.13")
    assert info["cupti_lib_version"] == "13.4.92"
    assert "cupti_libs_loaded" not in info and "cupti_api_version" not in info  # an empty file: no call
    maps.write_text(maps.read_text() + "7f40-7f50 r-xp 00000000 08:01 789 /opt/other/libcupti.so.13\n")
    assert library_info(str(maps))["cupti_libs_loaded"] == "2"  # two copies: said, not hidden
    assert library_info(str(tmp_path / "missing")) == {}
